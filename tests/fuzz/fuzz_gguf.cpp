// The GGUF reader (runtime/model/gguf_reader): the input is a .gguf file, opened
// through model_file::open as troupe opens any --model path (the GGUF magic
// picks gguf_file::open; other bytes get the llama2.c probe).  model_error is the documented error
// channel; a file that opens must have every tensor inside the mapping.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "runtime/model/gguf_reader.hpp"
#include "tests/fuzz/fuzz_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  troupe::fuzz::memory_file file(data, size);
  try {
    const auto model = troupe::model_file::open(file.path());
    const uint8_t* begin = model->mapping()->data();
    const uint8_t* end = begin + model->mapping()->size();
    for (const auto& [name, t] : model->tensors()) {
      if (t.data < begin || t.data > end || t.bytes > static_cast<size_t>(end - t.data))
        std::abort();
      // Touch the first and last byte: ASan checks the mapping is readable.
      if (t.bytes) {
        volatile uint8_t first = t.data[0], last = t.data[t.bytes - 1];
        (void)first;
        (void)last;
      }
    }
    if (const auto* g = dynamic_cast<const troupe::gguf_file*>(model.get()))
      (void)g->find_kv("general.name");
  } catch (const troupe::model_error&) {
  }
  return 0;
}
