# The client protocol: messages/client.proto -> ${TROUPE_PROTO_OUT}/messages/
# client.pb.{h,cc}.  One rule for the main build and the fuzz build
# (tests/fuzz), which include this after find_package(Protobuf).
set(TROUPE_PROTO_OUT ${CMAKE_BINARY_DIR}/generated)
add_custom_command(
  OUTPUT ${TROUPE_PROTO_OUT}/messages/client.pb.cc ${TROUPE_PROTO_OUT}/messages/client.pb.h
  COMMAND ${CMAKE_COMMAND} -E make_directory ${TROUPE_PROTO_OUT}
  COMMAND protobuf::protoc --cpp_out=${TROUPE_PROTO_OUT} -I ${CMAKE_SOURCE_DIR}
          ${CMAKE_SOURCE_DIR}/messages/client.proto
  DEPENDS ${CMAKE_SOURCE_DIR}/messages/client.proto protobuf::protoc
  COMMENT "Generating the client protocol (protobuf)")
