// The llama2.c readers (runtime/model/llama2c_reader): the input is a checkpoint
// followed by its tokenizer.bin.  When the first 28 bytes are a plausible
// header, the checkpoint is as long as that header implies (so the fuzzer
// reaches the tensors and the tokenizer) and the rest is the tokenizer;
// else the whole input is the checkpoint and the tokenizer is empty.
// model_error is the documented error channel.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "runtime/model/llama2c_reader.hpp"
#include "tests/fuzz/fuzz_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t model_bytes = size;
  if (size >= troupe::llama2c_header::bytes) {
    const auto header = troupe::llama2c_header::from_bytes(data);
    if (const auto want = header.expected_file_size(); want && *want <= size)
      model_bytes = static_cast<size_t>(*want);
  }
  troupe::fuzz::memory_file model(data, model_bytes);
  troupe::fuzz::memory_file tokenizer(data + model_bytes, size - model_bytes);
  try {
    const auto m = troupe::llama2c_file::open(model.path(), tokenizer.path());
    const uint8_t* begin = m->mapping()->data();
    const uint8_t* end = begin + m->mapping()->size();
    for (const auto& [name, t] : m->tensors())
      if (t.data < begin || t.data > end || t.bytes > static_cast<size_t>(end - t.data))
        std::abort();
    const auto& v = m->vocab();
    if (v.tokens.size() != static_cast<size_t>(m->hparams().n_vocab) ||
        v.scores.size() != v.tokens.size() || v.kinds.size() != v.tokens.size())
      std::abort();
  } catch (const troupe::model_error&) {
  }
  return 0;
}
