#pragma once
// The encoder protocol (EPD's E stage, issue 36 item 3): image bytes in,
// the rows they stand for in the language model's input out, as a prompt
// span (runtime/engine/prompt_embeds.hpp) whose `first` the request sets.
#include <caf/all.hpp>
#include <string>

#include "messages/atoms.hpp"
#include "messages/instance.hpp"

namespace troupe {

// Encodes one image (PNG or JPEG bytes) of the request whose sequence id
// is given (the encode ledger's owner, runtime/vision/encode_ledger); an
// error names what is wrong with it (caf::sec::invalid_argument: the
// client's fault; caf::sec::request_timeout: the request ended and its
// image was skipped).
using encoder_actor =
    caf::typed_actor<caf::replies_to<encode_atom, uint64_t, std::string>::with<prompt_embeds>>;

}  // namespace troupe
