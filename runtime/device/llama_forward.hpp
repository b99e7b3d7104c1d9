#pragma once
// The llama-family forward pass as a plan of OpenCL kernel launches over a
// flattened batch (runtime/engine/forward_batch.hpp), reading and writing a paged
// KV arena.  No actors here: the device actor owns one of these.
#include <algorithm>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/config/settings.hpp"
#include "runtime/device/cl_runtime.hpp"
#include "runtime/device/device_weights.hpp"
#include "runtime/device/draw_penalties.hpp"
#include "runtime/device/head_group.hpp"
#include "runtime/engine/forward_batch.hpp"
#include "runtime/model/model_file.hpp"

namespace troupe {

struct engine_options {
  cl::device_choice device;
  int page_size = 16;
  int n_pages = 0;               // 0: derive from kv_bytes
  size_t kv_bytes = 256u << 20;  // KV arena size when n_pages is 0
  bool kv_f16 = true;            // K and V as half (llama.cpp's default, and its numerics)
  int max_batch_tokens = 512;    // scratch is sized for this many rows (grown on demand)
  int rows_per_item = 16;        // matmul output rows per work-item (bench: best on PoCL)
  int group_size = 1;            // matmul work-items per work-group
  int token_tile = 8;            // tokens per work-item in prefill matmuls (bench: 8 > 4)
  int attention_rows = 4;        // rows of one sequence per attention work-item (prefill)
  // 4- and 8-bit weights: activations quantized to 8 bits per block and
  // integer dot products (llama.cpp's numerics; AVX-512 VNNI on PoCL where
  // the CPU has it).  Off: every weight dequantized to float.
  bool int8_dot = true;
  // Graph mode: steps of at most 64 rows (decode and small batches, where
  // launches cost most) are recorded once per shape as an OpenCL command
  // buffer (cl_khr_command_buffer) and replayed; where the device has no
  // command buffers, launched one by one.  Off by default: on PoCL it
  // gains nothing (docs/bench_engine.md), the cost is in running commands,
  // not in enqueuing them.
  bool graph = false;
  // Attention over a half KV cache in one pass with an online softmax
  // (llama.cpp's flash attention, -fa) instead of two passes with
  // llama.cpp's default numerics (bit-for-bit its golden tokens).
  bool flash_attention = false;
  // Fused layers: on a CPU device, each dense decoder layer runs as one
  // launch (kernels/layer.cl) instead of seven, its work-groups sharing
  // the work phase by phase.  Every launch wakes the driver's worker
  // threads, which costs most in decode steps (docs/bench_engine.md).
  // Same results bit for bit; engine.fuse_layers false turns it off.
  bool fuse_layers = true;
  // With fused layers, where every layer fuses with one weight type and
  // the layers' weights fit one device buffer: the whole step (embedding,
  // layers, final norm) as one launch, the classifier a second.  Same
  // results bit for bit; engine.fuse_step false turns it off.
  bool fuse_step = true;
  // With int8_dot on a CPU device with VNNI: a model whose layer matrices
  // are all Q4_1 holds them in panels (Q4_1P, kernels/matmul_panels.cl).
  bool int8_panels = true;
  // Queued steps (the device actor): a step is enqueued behind the one
  // running instead of after its result has reached the host, greedy and
  // seeded sampled tokens drawn on the device for the next step (step
  // overlap's placeholders).  Same results; engine.queue_steps false turns it off.
  bool queue_steps = true;
  // Mixture-of-experts models: the experts spread over this many
  // sub-devices of one compute unit each (expert parallelism; >= 2), each
  // with its own queue and weight buffers, tokens dispatched to the
  // sub-devices holding their experts; 0 or 1: on the device itself.
  int expert_devices = 0;
  // Pipeline parallelism (actors/pipeline.hpp): spawn_device runs the
  // model as this many stages, each a llama_forward over a contiguous
  // range of layers on its own slice of the device; 1: one device.
  int pipeline_stages = 1;
  // A stage's layers, [layer_first, layer_end) (layer_end 0: to the last).
  // A stage after the first takes its input as hidden states
  // (forward_batch::stage_input) instead of tokens; one before the last
  // answers with its output hidden states (forward_result::stage_output)
  // instead of logits.  Its KV arena holds its own layers only.
  int layer_first = 0;
  int layer_end = 0;
  // Layer migration between stages (runtime/device/layer_migration.hpp):
  // the busiest stage's excess over the mean that moves layers (0: never),
  // judged over windows of this many steps.
  double pipeline_rebalance = 0.1;
  int pipeline_window = 64;
  // Where each stage runs ("local", or a troupe node's HOST:PORT; empty:
  // every stage local), and the settings a node builds a stage from.
  std::vector<std::string> pipeline_nodes;
  std::shared_ptr<const engine_settings> settings;
  // How the layers split over the stages' devices: "even", or UELLM's
  // HELR placement by measured speeds ("he", "lr", "helr"), each device
  // giving the model at most pipeline_device_mb (0: its memory).
  std::string pipeline_placement = "even";
  int pipeline_device_mb = 0;
};

// The device's part of the [engine] settings (runtime/config/settings.def),
// on the device `where` (a slice of it when where.cores > 0).
engine_options engine_options_from(const engine_settings& s, cl::device_choice where);

// The options every kernels/*.cl program on `ctx` is built with (a
// matmul token tile, half KV, the host's instruction sets).  Contexts that
// build with the same options share PoCL's compiled kernels on disk.
std::string kernel_build_options(const cl::context& ctx, int token_tile, bool kv_f16);

// (cos, sin) of every row's RoPE angle for each rotation pair,
// [rows][rope_dims / 2][2]: computed once per step, read by every layer.
// freq_scale and freq_factors (rope_dims / 2 of them, or none) as in
// model_hparams.
std::vector<float> rope_table(const std::vector<int32_t>& positions, int rope_dims,
                              float theta_base, float freq_scale = 1.0f,
                              const std::vector<float>& freq_factors = {});

class llama_forward {
 public:
  llama_forward(std::shared_ptr<const model_file> model, const engine_options& opts);

  ~llama_forward();
  llama_forward(const llama_forward&) = delete;
  llama_forward& operator=(const llama_forward&) = delete;

  // Runs one step and waits for it: submit(batch, false), then collect().
  // Throws std::invalid_argument for a malformed batch.
  forward_result run(const forward_batch& batch);

  // Pipelined steps (step overlap on the device): submit() enqueues a step
  // behind those already submitted and returns; collect() waits for the
  // oldest submitted step and returns its result; on_done(ok) runs on a
  // driver thread once the step has ended.  With device_draws, the step's
  // presample rows (see draws_on_device) are drawn on
  // the device right after its logits (result.drawn), and the next step may
  // name them as tokens (forward_batch.hpp's device_draw_token), so it can
  // be submitted before this one ends.  Throws std::invalid_argument for a
  // malformed batch (a presample row outside its logit rows included), a
  // token naming a draw the last step did not make on the device, or
  // device draws for rows the device cannot draw; the batch is then not
  // submitted.
  void submit(const forward_batch& batch, bool device_draws,
              std::function<void(bool ok)> on_done = {});
  forward_result collect();
  size_t in_flight() const { return flights_.size(); }
  // Whether the device can make every one of these draws (greedy by
  // argmax_rows, sampled by sample_rows, penalized rows first by
  // penalize_rows, as the host sampler draws): each with a logit_bias
  // sorted by token and, with penalties, its window's counts sorted too.
  static bool draws_on_device(const std::vector<presample_row>& rows);

  const model_hparams& hparams() const { return model_->hparams(); }
  const model_file& model() const { return *model_; }
  const engine_options& options() const { return opts_; }
  int n_pages() const { return n_pages_; }
  int page_size() const { return opts_.page_size; }
  const std::string& device_name() const { return ctx_.device_name(); }
  size_t weight_bytes() const { return weights_.bytes; }
  size_t device_memory_bytes() const { return ctx_.global_mem_bytes(); }
  // Layers that run as one launch each (engine_options::fuse_layers).
  int fused_layers() const;
  // This forward's layers [first, end) (a pipeline stage's; else all).
  int layer_first() const { return layer_first_; }
  int layer_end() const { return layer_first_ + static_cast<int>(weights_.layers.size()); }
  bool first_stage() const { return layer_first_ == 0; }
  bool last_stage() const { return layer_end() == hparams().n_layer; }
  // Whether a step runs as one launch (engine_options::fuse_step).
  bool fused_step() const { return static_cast<bool>(step_offs_); }
  size_t kv_bytes_per_page() const;

  // Mixture of experts: tokens routed to each expert of each layer since the
  // last call ([layer][expert], n_layer x n_expert; empty for a dense model),
  // read and reset.  Waits for the device.
  std::vector<int64_t> take_expert_counts();
  // Layer `layer`'s expert placement (which experts each expert device holds).
  const expert_layout& experts_of(int layer) const;
  // Kernel seconds each expert device has run since the start (empty
  // without expert devices).  Waits for the device.
  std::vector<double> expert_busy_seconds();
  int expert_devices() const { return std::max(1, ctx_.shards()); }
  // Replaces layer `layer`'s expert weights with `moe` (uploaded beforehand
  // with upload_experts on this forward's context: the double buffer of a
  // placement change); takes effect from the next step.
  void set_experts(int layer, std::shared_ptr<device_moe> moe);
  cl::context& context() { return ctx_; }
  // The options this forward's kernels were built with (another context
  // on its device builds the same kernels with them: head_guest).
  std::string build_options() const;

  // KV-head migration (runtime/device/head_group.hpp): from the next step
  // on, KV heads [kv_lo, kv_hi) of every layer here, with their query
  // heads, attend through `call` (a helper stage's head_guest); kv_hi ==
  // kv_lo brings them home.  Layers then run apart, not fused.  The cache
  // still gets every head's K and V (the projections store them all), so
  // coming home needs no copy.  Throws std::invalid_argument for heads the
  // model lacks or a group of all of them.
  using head_call = std::function<head_answer(head_op)>;
  void attend_heads_elsewhere(int kv_lo, int kv_hi, head_call call);
  std::pair<int, int> heads_elsewhere() const { return {away_lo_, away_hi_}; }

  // Page data, for swap and copy-on-write.  A page's data is
  // kv_bytes_per_page() bytes: for each layer, its K block, then its V
  // block (kv heads x page_size x head_dim elements, as the cache stores
  // them).  Throws std::invalid_argument for a page outside the arena or a
  // size mismatch.
  std::vector<uint8_t> read_pages(const std::vector<int32_t>& pages);
  void write_pages(const std::vector<int32_t>& pages, const std::vector<uint8_t>& data);
  void copy_pages(const std::vector<int32_t>& src, const std::vector<int32_t>& dst);

 private:
  void validate(const forward_batch& b, bool device_draws) const;
  // Grows the scratch buffers; true when any was reallocated.
  bool ensure_scratch(int rows, int logit_rows);
  // Every launch of one step, from the embedding to the logits (R logit
  // rows), over the buffers run() filled.
  void enqueue_step(int T, int R, int att_rows);
  // Its launches before the classifier (the embedding, the layers, the
  // final norm of the R logit rows, to xo_ or quantized to qa_), one per
  // operation or per fused layer; whole_step() is the same in one launch.
  void step_apart(int T, int R, int att_rows);
  // Layer l's attention with a group of its KV heads away
  // (attend_heads_elsewhere): this stage's heads here, the group's rows to
  // the helper and its output back into att_ (and qb_ where att_q8).
  void attend_split(int l, int T, int att_rows, bool att_q8, bool swa, float scale);
  // x_ += RMSNorm(xn_) * weight over T rows (Gemma 3's sandwich norms).
  void norm_add(const cl::buffer& weight, int T);
  // Whether a step of `rows` rows is replayed from a recording.
  bool graph_mode(int rows) const;
  // Activations quantized to 8 bits (quantize.cl's format).
  struct q8_scratch {
    cl::buffer q, d, s;
  };
  // y (+)= w x; for an integer matmul, x is quantized first into qb_ unless
  // `xq` holds it quantized already.
  void matmul(const device_matrix& w, const cl::buffer& x, const cl::buffer& y, int rows, int ldy,
              bool accumulate, const q8_scratch* xq = nullptr);
  enum class mm_family { plain, glu, qkv, id, id_glu };
  cl::kernel& family_kernel(mm_family f, tensor_type t, int rows, bool xq);
  // Whether products with `w` take quantized activations (int8_dot).
  bool int8_for(const device_matrix& w) const;
  // The quantized input w's integer products read: 0 per 32 (q8_1), 1
  // Q8_K, 2 Q8_K with sums per 16 (KU6 weights).
  static int input_format(const device_matrix& w);
  // x's rows quantized for products with w: per 32 (llama.cpp's q8_1),
  // or per 256 as Q8_K where w is held from a K-quant.
  void quantize(const cl::buffer& x, int K, int rows, const q8_scratch& out,
                const device_matrix& w);
  // Whether the kernel producing w's input (a norm, attention, the FFN)
  // writes it quantized itself: integer products, per-32 activations.
  bool quantized_inline(const device_matrix& w) const { return int8_for(w) && !w.q8_k_acts; }
  // The normed rows in xn_ as w's quantized input in qa_ where w takes
  // Q8_K activations (null otherwise: the norm wrote qa_ or w reads xn_).
  const q8_scratch* normed_input(const device_matrix& w, int rows);
  // For a float w held from a K-quant (Q6_K), x rounded in place to its
  // Q8_K values (matmul does it for its input; the fused qkv and glu
  // kernels' callers for xn_).  x's only reader must be w's product: true
  // in the dense path; a K-quant MoE router would round the experts' input
  // too (llama.cpp's files keep routers F32).
  void round_for(const device_matrix& w, const cl::buffer& x, int rows);
  // RMSNorm of x_'s rows into xn_ (as float) or, for an integer matmul, into
  // qa_ (`rows`: the logit rows to gather, or null for all `n` rows).
  void norm(const cl::buffer& weight, bool to_q8, int n, const cl::buffer* rows = nullptr);
  // Sets a matmul kernel's weight and input arguments (x as float, or
  // quantized in *xq); returns the next argument's index.
  cl_uint matmul_inputs(cl::kernel& k, const device_matrix& w, const cl::buffer& x,
                        const q8_scratch* xq);
  // Tokens per matmul work-item for a batch of `rows`: 1 for one row, 4 for
  // small batches, token_tile from token_tile rows on.  One weight pass for
  // a whole tile beats a pass per row even when the tile's tail repeats
  // the last row.
  int tile_for(int rows) const;
  // Which of a family's kernels serves `rows` rows: 0 (_t1), 1 (_t4), 2 (_tiled).
  int tile_slot(int rows) const;
  size_t token_groups(int rows) const;
  // Launch geometry of the matmul kernels: each work-item computes
  // rows_per_item output rows (or rotation pairs, or gate/up pairs).
  struct matmul_grid {
    int rows_per_item = 1;
    int items = 0;
    size_t local = 16;
  };
  // For weights of type t: F32 panels (kernels/matmul_panels.cl) take
  // whole passes of 3 panels, k_panel_rows_per_item rows (or pairs).
  matmul_grid grid(tensor_type t, int units, int rows) const;
  static constexpr int k_panel_rows_per_item = 48;
  // Quantized panels (q4_1p) one panel a pass: two panels an item, so that
  // the gated FFN's items are whole blocks of 32 (and QKV's 16 pairs whole
  // panels).
  static constexpr int k_qpanel_rows_per_item = 32;
  // The gated FFN's: with quant_out, each work-item's rows are whole blocks
  // of 32 (it quantizes the rows it wrote).
  matmul_grid glu_grid(tensor_type t, int F, bool quant_out) const;
  void launch_grid(const cl::kernel& k, const matmul_grid& g, int rows);
  // Fused layers (engine_options::fuse_layers): whether layer L runs as one
  // launch (a dense layer whose four products share a weight type that
  // kernels/layer.cl has, or Q8_0, Q5_1 or Q5_0 ones with a K-quant down: k_down), and
  // that launch.
  bool fused(const device_layer& L) const;
  // Whether L is Q8_0, Q5_1 or Q5_0 with a K-quant down taking Q8_K activations
  // (layer.cl's _kd kernels).
  bool k_down(const device_layer& L) const;
  // Whether L is a Gemma 3 layer layer.cl's layer_gemma_* kernels run:
  // Q8_0 QKV and gate/up, K-quant Wo and down (its Q4_K_M files).
  bool gemma_fused(const device_layer& L) const;
  void layer_step(const device_layer& L, int layer, int T, int att_rows);
  // The layer's (or, whole_step, the step's) kernel for T rows, made once.
  cl::kernel& layer_kernel(bool whole_step, const device_layer& L, int T);
  // A whole step in one launch (engine_options::fuse_step): the embedding,
  // every layer and the final norm of R rows.
  bool can_fuse_step() const;
  // Sets the arguments layer.cl's layers and steps share (LAYER_IO_ARGS)
  // from `first` on; returns the index after them.
  // `layer`: this forward's layer (its RoPE table: a windowed layer's own).
  cl_uint layer_io_args(cl::kernel& k, cl_uint first, int T, int att_rows, bool h_q8, int layer);
  void whole_step(int T, int R, int att_rows);

  std::shared_ptr<const model_file> model_;
  engine_options opts_;
  int layer_first_ = 0;  // the first of this forward's layers (a pipeline stage's)
  cl::context ctx_;
  device_weights weights_;
  int n_pages_ = 0;
  cl::buffer k_cache_, v_cache_;

  // scratch, sized for scratch_rows_ rows
  int scratch_rows_ = 0, scratch_logit_rows_ = 0;
  cl::buffer x_, xn_, qkv_, att_, h_, xo_, logits_;
  cl::buffer tokens_, pos_, row_seq_, pt_, pt_off_, logit_rows_, rope_;
  cl::buffer gelu_tab_;  // GELU of every half (gelu_half_table), for Gemma's FFN
  cl::buffer rope_swa_;  // windowed layers' RoPE table (their own base)
  // Embedding rows (forward_batch::hidden_rows) and their normed states.
  cl::buffer hidden_rows_, xh_;
  int hidden_capacity_ = 0;
  // Device draws (kernels/draw.cl): the logit row of each, and the tokens
  // drawn (read by the next step's embedding); room for draw_capacity_.
  cl::kernel k_argmax_, k_sample_, k_penalize_;
  cl::buffer draw_rows_, drawn_;
  cl::buffer bias_off_, bias_tok_, bias_val_;  // the draws' logit_bias
  cl::buffer greedy_which_;                    // the draws argmax_rows makes
  // Sampled draws (temperature > 0): which draws, their parameters, their
  // random bits, and sample_rows' scratch (three vocabulary rows for each
  // draw of one launch).
  cl::buffer sample_which_, sample_fpar_, sample_ipar_, sample_bits_, sample_scratch_;
  // Penalized draws (runtime/device/draw_penalties.hpp): penalize_rows'
  // inputs; their rows follow the step's logit rows in logits_.
  cl::buffer pen_src_, pen_dst_, pen_input_, pen_par_, pen_off_, pen_tok_, pen_cnt_, pen_has_,
      pen_bias_;
  int draw_capacity_ = 0;
  int device_draws_ = 0;  // draws the step submitted last made on the device
  // Grows the draw buffers to hold n draws, keeping the last step's.
  bool ensure_draws(int n);
  // Enqueues the device draws of b's presample rows (after its logits):
  // the greedy rows by argmax_rows, the sampled rows by sample_rows
  // (llama_forward_draws.cpp).
  struct flight;
  void enqueue_draws(const forward_batch& b, flight& f);
  void enqueue_penalties(const forward_batch& b, flight& f);
  // Sizes the draws' input buffers for b before any of its writes is
  // queued (an allocation that fails then leaves nothing half-queued).
  void ensure_draw_inputs(const forward_batch& b);

  // A submitted step: the host memory its writes read and its reads fill,
  // held until collect() (the writes and reads do not wait).
  struct flight {
    std::vector<int32_t> tokens, positions, row_seq, pt, pt_off, logit_rows, draw_rows, hidden_rows;
    std::vector<int32_t> bias_off, bias_tok;  // the draws' logit_bias (draw.cl)
    std::vector<float> bias_val;
    std::vector<int32_t> greedy_which;  // greedy draws: which
    std::vector<int32_t> sample_which;  // sampled draws: which, and their parameters
    std::vector<float> sample_fpar;
    std::vector<uint32_t> sample_ipar;
    std::vector<uint64_t> sample_bits;
    penalty_inputs penalties;
    std::vector<float> rope, rope_swa;
    std::vector<float> stage_input;   // a later pipeline stage's input rows
    std::vector<int32_t> embed_rows;  // rows whose input is an embedding (images)
    std::vector<float> embed_input;
    forward_result result;
    cl::event done;
  };
  std::deque<std::unique_ptr<flight>> flights_;
  const flight* building_ = nullptr;  // the step being enqueued (its host tables)
  // Writes the step's embedding rows (images) over the token embeddings in x_.
  void write_embed_rows(const flight& f);
  // KV heads attending elsewhere (attend_heads_elsewhere), and the rows'
  // K and V gathered for them.
  int away_lo_ = 0, away_hi_ = 0;
  head_call away_call_;
  cl::kernel k_kv_copy_;
  cl::buffer kv_rows_;
  size_t kv_rows_bytes_ = 0;
  // Quantized activations: qa_ the norms' rows (inputs of QKV, gate/up
  // and the classifier), qb_ attention's and the FFN's (of Wo and down).
  q8_scratch qa_, qb_;

  cl::kernel k_embed_, k_rmsnorm_, k_rmsnorm_q8_, k_quant_, k_quant_k_, k_round_k_, k_attn_;
  // Gemma 3's extra operations (null for other models): the embedding
  // scale, per-head QK-norm with RoPE and the cache store, sandwich norms.
  cl::kernel k_scale_, k_softcap_, k_qk_norm_, k_norm_add_;
  // The device's weight types, as the kernels name them, in the .cpp's
  // type_slot order; the kernel caches below have a slot for each.
  static constexpr const char* k_type_suffix[] = {"f32",  "f16",  "q4_0", "q4_1", "q8_0",  "ku6",
                                                  "q5_1", "bf16", "f32p", "q5_0", "q4_1p", "q8_0p"};
  static constexpr int k_device_types = static_cast<int>(std::size(k_type_suffix));
  cl::kernel k_mm_[2][5][k_device_types][3];  // [float x, quantized x][family][type][tile]
  // Fused layers: [QKV's type][a K-quant down (k_down)][t1, t4, tiled].
  cl::kernel k_layer_[k_device_types][2][3];
  cl::buffer layer_ctr_;         // their work-sharing counters (zero between launches)
  cl::kernel k_layer_gemma_[2][3];           // fused Gemma 3 layers: [gate/up Q5_0][t1, t4, tiled]
  cl::kernel k_step_[k_device_types][2][3];  // whole steps: [as k_layer_]
  cl::buffer step_offs_;         // the layers' tensors' offsets in weights_.arena

  // Mixture of experts (hparams().n_expert > 0): the router's logits, each
  // assignment's slot and weight, the assignments grouped by slot, the
  // experts' FFN rows (h, and quantized for an integer down projection)
  // and outputs, sized for scratch_rows_ tokens; per-expert token counts of
  // every layer since the last take_expert_counts().
  cl::kernel k_moe_route_, k_moe_combine_;
  cl::buffer moe_logits_, moe_sel_, moe_w_, moe_slot_off_, moe_slot_rows_, moe_h_, moe_y_;
  q8_scratch moe_hq_;
  cl::buffer expert_counts_;
  int moe_slot_capacity_ = 0;  // slot_off_ holds this many slots (+1)
  // Qwen2-MoE's shared expert: its outputs and gate logits per token.
  cl::buffer shared_y_, shared_g_;
  void moe_ffn(const device_layer& L, int layer, int T);
  // The gated FFN of F rows over xn_ (qa_ where `xq`: quantized already),
  // h_ in between: y (+)= down(silu(gate x) * up x).
  void glu_ffn(const device_matrix& gate_up, const device_matrix& down, int F, int T, bool xq,
               const cl::buffer& y, bool accumulate);

  // Graph mode's recordings by (rows, logit rows, attention rows per item).
  static constexpr int k_max_graph_rows = 64;
  static constexpr size_t k_max_graphs = 64;
  std::map<std::tuple<int, int, int>, cl::command_buffer> graphs_;
};

}  // namespace troupe
