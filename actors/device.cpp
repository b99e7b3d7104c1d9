#include "actors/device.hpp"

namespace troupe {

namespace {

device_actor::behavior_type device_behavior(device_actor::pointer self,
                                            std::shared_ptr<llama_forward> engine) {
  return {
      [engine](forward_atom, const forward_batch& batch) -> caf::result<forward_result> {
        try {
          return engine->run(batch);
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, std::string("forward: ") + e.what());
        }
      },
      [engine](info_atom) {
        device_info info;
        info.device_name = engine->device_name();
        info.model_path = engine->model().path();
        info.model_fingerprint = engine->model().fingerprint();
        info.n_vocab = engine->hparams().n_vocab;
        info.n_ctx = engine->hparams().n_ctx_train;
        info.n_pages = engine->n_pages();
        info.page_size = engine->page_size();
        info.weight_bytes = engine->weight_bytes();
        info.kv_bytes_per_page = engine->kv_bytes_per_page();
        const auto& hp = engine->hparams();
        info.n_layers = hp.n_layer;
        info.n_kv_heads = hp.n_head_kv;
        info.head_dim = hp.head_dim;
        const uint64_t elems = 2ull * hp.n_layer * hp.n_head_kv * hp.head_dim * info.page_size;
        info.kv_dtype = info.kv_bytes_per_page == 2 * elems ? "f16" : "f32";
        return info;
      },
      [engine](read_pages_atom,
               const std::vector<int32_t>& pages) -> caf::result<std::vector<uint8_t>> {
        try {
          return engine->read_pages(pages);
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, std::string("readpages: ") + e.what());
        }
      },
      [engine](write_pages_atom, const std::vector<int32_t>& pages,
               const std::vector<uint8_t>& data) -> caf::result<int32_t> {
        try {
          engine->write_pages(pages, data);
          return static_cast<int32_t>(pages.size());
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument,
                                 std::string("writepages: ") + e.what());
        }
      },
      [engine](copy_pages_atom, const std::vector<int32_t>& src,
               const std::vector<int32_t>& dst) -> caf::result<int32_t> {
        try {
          engine->copy_pages(src, dst);
          return static_cast<int32_t>(src.size());
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, std::string("copypages: ") + e.what());
        }
      },
  };
}

}  // namespace

device_actor spawn_device(caf::actor_system& sys, std::shared_ptr<const model_file> model,
                          const engine_options& opts) {
  auto engine = std::make_shared<llama_forward>(std::move(model), opts);
  return sys.spawn<caf::detached>(device_behavior, std::move(engine));
}

}  // namespace troupe
