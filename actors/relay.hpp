#pragma once
// Answers a request with another actor's answer: the reply, or its error.
// Most admin and gateway handlers are such forwards; CAF 0.17's typed
// request(...).then cannot return a value, so each needs a promise.
#include <caf/all.hpp>
#include <utility>

namespace troupe {

template <class T, class Self, class Dest, class Timeout, class... Ts>
caf::result<T> relay(Self* self, const Dest& dest, const Timeout& timeout, Ts&&... xs) {
  auto rp = self->template make_response_promise<T>();
  self->request(dest, timeout, std::forward<Ts>(xs)...)
      .then([rp](T& x) mutable { rp.deliver(std::move(x)); },
            [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
  return rp;
}

}  // namespace troupe
