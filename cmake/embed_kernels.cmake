# Turns every kernels/*.cl into one C++ source with a table of
# {name, source} pairs, so the binary carries its kernels and needs no
# files at run time.  Run as: cmake -DSRC_DIR=... -DOUT=... -P embed_kernels.cmake
file(GLOB cl_files "${SRC_DIR}/*.cl")
list(SORT cl_files)
# common.cl holds helpers the other files use: it goes first.  layer.cl
# runs the other files' kernel bodies: it goes last.
list(FILTER cl_files EXCLUDE REGEX "/(common|layer)\\.cl$")
list(PREPEND cl_files "${SRC_DIR}/common.cl")
list(APPEND cl_files "${SRC_DIR}/layer.cl")
set(body "// generated from kernels/*.cl by cmake/embed_kernels.cmake; do not edit\n")
string(APPEND body "#include \"runtime/device/kernel_sources.hpp\"\n\nnamespace troupe {\n\n")
string(APPEND body "const std::vector<kernel_source>& embedded_kernel_sources() {\n")
string(APPEND body "  static const std::vector<kernel_source> sources = {\n")
foreach(f ${cl_files})
  get_filename_component(name "${f}" NAME_WE)
  file(READ "${f}" text)
  string(APPEND body "    {\"${name}\", R\"TROUPECL(${text})TROUPECL\"},\n")
endforeach()
string(APPEND body "  };\n  return sources;\n}\n\n}  // namespace troupe\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
else()
  set(old "")
endif()
if(NOT old STREQUAL body)
  file(WRITE "${OUT}" "${body}")
endif()
