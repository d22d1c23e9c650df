// Native CPU kernels of gnn-dist, built on first use by kernels/native.py.
//
// 1. Row-parallel CSR SpMM: Y[i, :] = sum_k val[k] * X[col[k], :] (+ bias), for the local
// [owned | halo] operator and its transpose. Rows are split across torch's intra-op
// threads (at::parallel_for honours torch.set_num_threads, i.e. --threads); the inner
// loop runs over the contiguous feature dimension so the compiler vectorises it.
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
#include <vector>
#include <ATen/Parallel.h>

// These kernels read raw host pointers: every entry point checks at its door that the tensors it reads are on
// the CPU, so a device tensor gets a Python error naming the kernel, not a crash inside C++.
static void on_host(std::initializer_list<torch::Tensor> tensors, const char* kernel) {
  for (const auto& t : tensors)
    TORCH_CHECK(!t.defined() || t.device().is_cpu(), kernel, ": the native kernels serve CPU tensors only, got a ",
                t.device().str(), " tensor (a device run takes the torch formulation)");
}

// The rows an entry reads (of x in the SpMM, of the source or gradient rows in attention) are random, so each
// one's first lines miss: the kernels' loops over entries ask for the row of the entry kAhead entries on (past
// the row's end too: a sampled block's rows hold a handful of entries) while they work on the current one.
// Measured on a sampled block's input layer (125k entries of 128 floats from 45.7k rows, Zen 4, one thread):
// 7.9 ms without, 3.7-6.0 ms with 4 ahead (2 and 8 within the noise of it).
constexpr int64_t kAhead = 4;

// Asks for row rows_of[entry] - offset of `base` (width elements a row) when entry < limit (the last entry
// the caller's chunk lists). A hint: it never faults, whatever the address.
template <typename scalar_t, typename index_t>
static inline void prefetch_entry_row(const scalar_t* base, const index_t* rows_of, int64_t entry, int64_t limit,
                                      int64_t offset, int64_t width) {
  if (entry >= limit) return;
  const char* p = reinterpret_cast<const char*>(base + (static_cast<int64_t>(rows_of[entry]) - offset) * width);
  const int64_t bytes = width * static_cast<int64_t>(sizeof(scalar_t));
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}

// Rows r of the output from entries [begin[r], end[r]) of a CSR operator (MKL's four-array form: a row's
// entries need not run to the next row's start), reading x at row col[k] - col_offset. With begin = crow and
// end = crow + 1 this is the plain product; other ranges take a row's owned-column or halo-column entries
// alone (gnn_dist.halo_overlap), whose x is then only that side's rows. accumulate adds to y instead of
// overwriting it (and takes no bias).
template <typename scalar_t, typename index_t>
static void spmm_rows(const index_t* begin, const index_t* end, const index_t* col, const scalar_t* val,
                      const scalar_t* x, int64_t col_offset, const scalar_t* bias, bool accumulate, scalar_t* y,
                      int64_t first, int64_t last, int64_t width) {
  // Entries up to the chunk's last one are listed (ranges may skip some between rows: asking for a skipped
  // entry's row only wastes the hint).
  const int64_t ahead_limit = last > first ? static_cast<int64_t>(end[last - 1]) : 0;
  for (int64_t i = first; i < last; ++i) {
    scalar_t* __restrict__ out = y + i * width;
    if (bias != nullptr) {
      for (int64_t f = 0; f < width; ++f) out[f] = bias[f];
    } else if (!accumulate) {
      for (int64_t f = 0; f < width; ++f) out[f] = scalar_t(0);
    }
    const int64_t stop = end[i];
    int64_t k = begin[i];
    // Two neighbours per pass halves the loads and stores of the output row.
    for (; k + 1 < stop; k += 2) {
      prefetch_entry_row(x, col, k + kAhead, ahead_limit, col_offset, width);
      prefetch_entry_row(x, col, k + kAhead + 1, ahead_limit, col_offset, width);
      const scalar_t a = val[k], b = val[k + 1];
      const scalar_t* __restrict__ xa = x + (static_cast<int64_t>(col[k]) - col_offset) * width;
      const scalar_t* __restrict__ xb = x + (static_cast<int64_t>(col[k + 1]) - col_offset) * width;
      for (int64_t f = 0; f < width; ++f) out[f] += a * xa[f] + b * xb[f];
    }
    if (k < stop) {
      prefetch_entry_row(x, col, k + kAhead, ahead_limit, col_offset, width);
      const scalar_t a = val[k];
      const scalar_t* __restrict__ xa = x + (static_cast<int64_t>(col[k]) - col_offset) * width;
      for (int64_t f = 0; f < width; ++f) out[f] += a * xa[f];
    }
  }
}

template <typename index_t>
static void spmm_dispatch(const torch::Tensor& begin, const torch::Tensor& end, const torch::Tensor& col,
                          const torch::Tensor& val, const torch::Tensor& x, int64_t col_offset,
                          const c10::optional<torch::Tensor>& bias, bool accumulate, torch::Tensor& y) {
  const int64_t rows = y.size(0);
  const int64_t width = x.size(1);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "csr_spmm", [&] {
    const index_t* begin_p = begin.data_ptr<index_t>();
    const index_t* end_p = end.data_ptr<index_t>();
    const index_t* col_p = col.data_ptr<index_t>();
    const scalar_t* val_p = val.data_ptr<scalar_t>();
    const scalar_t* x_p = x.data_ptr<scalar_t>();
    const scalar_t* bias_p = bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr;
    scalar_t* y_p = y.data_ptr<scalar_t>();
    // Grain: enough rows that a chunk is worth a task; row costs vary with degree.
    at::parallel_for(0, rows, 256, [&](int64_t first, int64_t last) {
      spmm_rows<scalar_t, index_t>(begin_p, end_p, col_p, val_p, x_p, col_offset, bias_p, accumulate, y_p, first,
                                   last, width);
    });
  });
}

static void check_operands(const torch::Tensor& crow, const torch::Tensor& col, const torch::Tensor& val,
                           const torch::Tensor& x, const c10::optional<torch::Tensor>& bias, const char* kernel) {
  on_host({crow, col, val, x}, kernel);
  if (bias) on_host({*bias}, kernel);
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous matrix");
  TORCH_CHECK(crow.scalar_type() == col.scalar_type() &&
              (crow.scalar_type() == torch::kInt64 || crow.scalar_type() == torch::kInt32),
              "indices must be int32 or int64, both the same");
  TORCH_CHECK(val.scalar_type() == x.scalar_type(), "values and x must share a dtype");
}

static void spmm_typed(const torch::Tensor& begin, const torch::Tensor& end, const torch::Tensor& col,
                       const torch::Tensor& val, const torch::Tensor& x, int64_t col_offset,
                       const c10::optional<torch::Tensor>& bias, bool accumulate, torch::Tensor& y) {
  if (y.size(0) == 0 || x.size(1) == 0) return;
  if (col.scalar_type() == torch::kInt32)
    spmm_dispatch<int32_t>(begin, end, col, val, x, col_offset, bias, accumulate, y);
  else
    spmm_dispatch<int64_t>(begin, end, col, val, x, col_offset, bias, accumulate, y);
}

// int32 indices (what kernels/spmm.py builds whenever nnz < 2**31) halve the index bytes
// streamed per non-zero; int64 is accepted for larger matrices.
torch::Tensor csr_spmm(torch::Tensor crow, torch::Tensor col, torch::Tensor val, torch::Tensor x,
                       c10::optional<torch::Tensor> bias) {
  check_operands(crow, col, val, x, bias, "csr_spmm");
  const int64_t rows = crow.size(0) - 1;
  auto y = torch::empty({rows, x.size(1)}, x.options());
  spmm_typed(crow.narrow(0, 0, rows), crow.narrow(0, 1, rows), col, val, x, 0, bias, false, y);
  return y;
}

// y[r] = (or +=) sum over entries [begin[r], end[r]) of val[k] * x[col[k] - col_offset] (+ bias), in place:
// the product of one side of a row's columns (owned or halo), or of a range of rows, into rows a caller owns.
void csr_spmm_into(torch::Tensor begin, torch::Tensor end, torch::Tensor col, torch::Tensor val, torch::Tensor x,
                   int64_t col_offset, c10::optional<torch::Tensor> bias, bool accumulate, torch::Tensor y) {
  check_operands(begin, col, val, x, bias, "csr_spmm_into");
  on_host({end, y}, "csr_spmm_into");
  TORCH_CHECK(begin.scalar_type() == end.scalar_type() && begin.is_contiguous() && end.is_contiguous() &&
              begin.size(0) == y.size(0) && end.size(0) == y.size(0),
              "begin and end must be contiguous, one entry per output row, of one index type");
  TORCH_CHECK(y.dim() == 2 && y.is_contiguous() && y.size(1) == x.size(1) && y.scalar_type() == x.scalar_type(),
              "y must be a contiguous matrix of x's width and dtype");
  TORCH_CHECK(!(accumulate && bias), "an accumulating product takes no bias");
  spmm_typed(begin, end, col, val, x, col_offset, bias, accumulate, y);
}

// 2. Keyed dropout (optionally fused with the ReLU before it) in one pass over memory.
// The mask word of element (i, c) is lowbias32(row_hash[i] ^ col_hash[c]), exactly the
// hash of gnn_dist/dropout.py, so masks do not depend on which kernel ran. Returns the
// output and the uint8 mask of kept (and, with relu, positive) elements for the backward.
static inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// Eight 0/1 bytes b0..b7, read little-endian as one word, become one byte with b_j at bit j: the
// multiplier moves byte j's bit to bit 56 + j, and no two partial products meet (8j - 7k is distinct).
static inline void pack_bits(const uint8_t* keep, int64_t width, uint8_t* out) {
  int64_t c0 = 0;
  for (; c0 + 8 <= width; c0 += 8) {
    uint64_t word;
    std::memcpy(&word, keep + c0, 8);
    out[c0 >> 3] = static_cast<uint8_t>((word * 0x0102040810204080ull) >> 56);
  }
  if (c0 < width) {
    uint8_t bits = 0;
    for (int64_t c = c0; c < width; ++c) bits |= static_cast<uint8_t>(keep[c]) << (c - c0);
    out[c0 >> 3] = bits;
  }
}

// The inverse of pack_bits: byte j of the result is bit j of `bits` (0 or 1). Multiplying by 0x0101...
// copies the byte into all eight, the mask keeps bit j in byte j, and adding 0x7F to each byte (never
// carrying into the next: at most 0x7F + 0x80) moves "bit j was set" to each byte's top bit.
static inline uint64_t unpack_bits(uint8_t bits) {
  const uint64_t spread = (bits * 0x0101010101010101ull) & 0x8040201008040201ull;
  return ((spread + 0x7F7F7F7F7F7F7F7Full) >> 7) & 0x0101010101010101ull;
}

// a if mask is all ones, +0.0 if it is zero: a select without a branch. The compiler vectorises the loops
// below only without control flow in them, and a ternary on floats is control flow to it (v * s must not
// run for a dropped element under -ftrapping-math): written this way they run 9-10x faster on AVX2 hosts
// (measured: 8.6 against 0.9 ns per element on a 2708 x 1433 matrix, Zen 2).
static inline float select_bits(float a, int32_t mask) {
  int32_t bits;
  std::memcpy(&bits, &a, sizeof bits);
  bits &= mask;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

// One row of the keyed dropout: oi[c] = xi[c] * s where kept, else 0; word[c] = -1 where kept, else 0.
// In place (xi == oi) the row is read through the output pointer itself, so the compiler sees one array
// read and written at the same index (a loop it vectorises), not two pointers that might overlap.
template <bool RELU, bool INPLACE>
static inline void dropout_row(const float* xi, float* oi, int32_t* __restrict__ word,
                               const uint32_t* __restrict__ ch, uint32_t r, int64_t width, int32_t thr, float s) {
  const float* src = INPLACE ? oi : xi;
  for (int64_t c = 0; c < width; ++c) {
    const float v = src[c];
    int32_t kept = -static_cast<int32_t>(static_cast<int32_t>(mix32(r ^ ch[c])) >= thr);
    if (RELU) kept &= -static_cast<int32_t>(v > 0.0f);
    oi[c] = select_bits(v * s, kept);
    word[c] = kept;
  }
}

std::vector<torch::Tensor> keyed_dropout(torch::Tensor x, torch::Tensor row_hash, torch::Tensor col_hash,
                                         int64_t threshold, double scale, bool relu, bool inplace) {
  on_host({x, row_hash, col_hash}, "keyed_dropout");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "x: contiguous float32 matrix");
  TORCH_CHECK(row_hash.scalar_type() == torch::kInt32 && col_hash.scalar_type() == torch::kInt32, "hashes: int32");
  const int64_t rows = x.size(0), width = x.size(1);
  // In place, each element is read before it is written, so x can be its own output (a layer's output that
  // nothing saved need not be copied).
  auto out = inplace ? x : torch::empty_like(x);
  // The mask the backward needs, one bit per element (bit c % 8 of byte c / 8 of its row): an eighth of a
  // byte mask, and a thirty-second of the activation. Rows start on whole bytes, so rows pack in parallel.
  const int64_t row_bytes = (width + 7) / 8;
  auto mask = torch::empty({rows, row_bytes}, x.options().dtype(torch::kUInt8));
  const float* x_p = x.data_ptr<float>();
  const uint32_t* rh = reinterpret_cast<const uint32_t*>(row_hash.data_ptr<int32_t>());
  const uint32_t* ch = reinterpret_cast<const uint32_t*>(col_hash.data_ptr<int32_t>());
  float* o_p = out.data_ptr<float>();
  uint8_t* m_p = mask.data_ptr<uint8_t>();
  const int32_t thr = static_cast<int32_t>(threshold);
  const float s = static_cast<float>(scale);
  at::parallel_for(0, rows, 512, [&](int64_t begin, int64_t end) {
    // One word per column first (a loop the compiler vectorises), then one byte, then packed eight to a byte.
    std::vector<int32_t> word_row(width);
    std::vector<uint8_t> keep_row(width + 8, 0);
    for (int64_t i = begin; i < end; ++i) {
      const float* xi = x_p + i * width;
      float* oi = o_p + i * width;
      int32_t* word = word_row.data();
      if (relu && inplace)
        dropout_row<true, true>(xi, oi, word, ch, rh[i], width, thr, s);
      else if (relu)
        dropout_row<true, false>(xi, oi, word, ch, rh[i], width, thr, s);
      else if (inplace)
        dropout_row<false, true>(xi, oi, word, ch, rh[i], width, thr, s);
      else
        dropout_row<false, false>(xi, oi, word, ch, rh[i], width, thr, s);
      uint8_t* keep = keep_row.data();
      for (int64_t c = 0; c < width; ++c) keep[c] = static_cast<uint8_t>(word_row[c] & 1);
      pack_bits(keep, width, m_p + i * row_bytes);
    }
  });
  return {out, mask};
}

// Backward of the keyed dropout: grad * mask * scale in one pass, reading the packed bit mask.
torch::Tensor masked_scale(torch::Tensor grad, torch::Tensor mask, double scale) {
  on_host({grad, mask}, "masked_scale");
  TORCH_CHECK(grad.scalar_type() == torch::kFloat32 && mask.scalar_type() == torch::kUInt8, "float32 grad, uint8 mask");
  TORCH_CHECK(grad.dim() == 2 && mask.dim() == 2 && grad.size(0) == mask.size(0) &&
              mask.size(1) == (grad.size(1) + 7) / 8, "mask: one bit per element of grad, rows padded to bytes");
  grad = grad.contiguous();
  mask = mask.contiguous();
  auto out = torch::empty_like(grad);
  const int64_t rows = grad.size(0), width = grad.size(1), row_bytes = mask.size(1);
  const float* g = grad.data_ptr<float>();
  const uint8_t* m = mask.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  at::parallel_for(0, rows, 512, [&](int64_t begin, int64_t end) {
    // The row's bits unpacked to one byte per column, then a branch-free pass the compiler vectorises.
    std::vector<uint8_t> keep_row(row_bytes * 8);
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t* mi = m + i * row_bytes;
      uint8_t* keep = keep_row.data();
      for (int64_t b = 0; b < row_bytes; ++b) {
        const uint64_t bytes = unpack_bits(mi[b]);
        std::memcpy(keep + 8 * b, &bytes, 8);
      }
      const float* __restrict__ gi = g + i * width;
      float* __restrict__ oi = o + i * width;
      for (int64_t c = 0; c < width; ++c) oi[c] = select_bits(gi[c] * s, -static_cast<int32_t>(keep[c]));
    }
  });
  return out;
}

// SparseAdam's update of some rows of a table, in one pass over each row (gnn_dist/hetero/mini_batch.py's
// sparse_adam_step, whose torch formulation reads and writes every row's moments several times): for each
// listed row r (each once) with gradient g, m += (g - m)(1 - beta1), v += (g^2 - v)(1 - beta2), and
// param -= step_size * m / (sqrt(v) + eps), in float32 as torch.optim.SparseAdam computes it.
// no-math-errno: sqrt may then be vectorised (it sets no errno on a negative input, which v never is)
__attribute__((optimize("no-math-errno"))) void sparse_adam_rows(torch::Tensor param, torch::Tensor exp_avg, torch::Tensor exp_avg_sq, torch::Tensor rows,
                      torch::Tensor grad, double step_size, double beta1, double beta2, double eps) {
  on_host({param, exp_avg, exp_avg_sq, rows, grad}, "sparse_adam_rows");
  TORCH_CHECK(param.scalar_type() == torch::kFloat32 && exp_avg.scalar_type() == torch::kFloat32 &&
              exp_avg_sq.scalar_type() == torch::kFloat32 && grad.scalar_type() == torch::kFloat32,
              "float32 table, moments and gradient");
  TORCH_CHECK(param.is_contiguous() && exp_avg.is_contiguous() && exp_avg_sq.is_contiguous(),
              "contiguous table and moments (they are updated in place)");
  TORCH_CHECK(rows.scalar_type() == torch::kInt64 && rows.dim() == 1 && grad.dim() == 2 &&
              grad.size(0) == rows.size(0) && grad.size(1) == param.size(1) && param.sizes() == exp_avg.sizes() &&
              param.sizes() == exp_avg_sq.sizes(), "rows [m], grad [m, width] of a [n, width] table");
  grad = grad.contiguous();
  rows = rows.contiguous();
  const int64_t m = rows.size(0), width = param.size(1), n = param.size(0);
  const int64_t* r = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < m; ++i) TORCH_CHECK(r[i] >= 0 && r[i] < n, "sparse_adam_rows: row out of range");
  float* p = param.data_ptr<float>();
  float* ma = exp_avg.data_ptr<float>();
  float* va = exp_avg_sq.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  const float b1 = static_cast<float>(1.0 - beta1), b2 = static_cast<float>(1.0 - beta2);
  const float size = static_cast<float>(step_size), epsilon = static_cast<float>(eps);
  at::parallel_for(0, m, 256, [&](int64_t begin, int64_t end) {
    constexpr int64_t ahead = 8;  // rows are scattered over the table: fetch a later row's lines meanwhile
    for (int64_t i = begin; i < end; ++i) {
      if (i + ahead < end) {
        const int64_t later = r[i + ahead] * width;
        for (int64_t c = 0; c < width; c += 16) {
          __builtin_prefetch(p + later + c, 1);
          __builtin_prefetch(ma + later + c, 1);
          __builtin_prefetch(va + later + c, 1);
        }
      }
      const int64_t at = r[i] * width;
      const float* __restrict__ gi = g + i * width;
      float* __restrict__ pi = p + at;
      float* __restrict__ mi = ma + at;
      float* __restrict__ vi = va + at;
      for (int64_t c = 0; c < width; ++c) {
        const float mean = mi[c] + (gi[c] - mi[c]) * b1;
        const float square = vi[c] + (gi[c] * gi[c] - vi[c]) * b2;
        mi[c] = mean;
        vi[c] = square;
        pi[c] -= size * (mean / (std::sqrt(square) + epsilon));
      }
    }
  });
}

// 3. Uniform neighbour sampling without replacement, the kernel of gnn_dist/graph/sampler.py's
// sample_owned: candidate u of target v scores splitmix(splitmix(orig(v) ^ key) ^ orig(u)), and the
// `fanout` smallest scores win (ties by CSR position), listed in CSR order: exactly the numpy path's
// choice. A row with at most `fanout` neighbours keeps them all, so its scores are never computed.
static inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// rows: owned local rows; col_orig: every local id's original id (what the scores hash; an owned row's own
// original id is its entry too); col_global: every local id's global id (what the output lists).
std::vector<torch::Tensor> sample_rows(torch::Tensor indptr, torch::Tensor indices, torch::Tensor rows,
                                       torch::Tensor col_orig, torch::Tensor col_global, int64_t key,
                                       int64_t fanout) {
  on_host({indptr, indices, rows, col_orig, col_global}, "sample_rows");
  for (const auto& t : {indptr, indices, rows, col_orig, col_global})
    TORCH_CHECK(t.scalar_type() == torch::kInt64 && t.is_contiguous(), "sample_rows: contiguous int64 inputs");
  const int64_t m = rows.size(0);
  const int64_t* ip = indptr.data_ptr<int64_t>();
  const int64_t* ix = indices.data_ptr<int64_t>();
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t* co = col_orig.data_ptr<int64_t>();
  const int64_t* cg = col_global.data_ptr<int64_t>();
  auto counts = torch::empty({m}, rows.options());
  int64_t* cp = counts.data_ptr<int64_t>();
  std::vector<int64_t> offsets(m + 1), starts(m), stops(m);
  int64_t* op = offsets.data();
  op[0] = 0;
  for (int64_t r = 0; r < m; ++r) {  // the rows' CSR ranges, read once: rows come in no order, so each is a miss
    starts[r] = ip[rp[r]];
    stops[r] = ip[rp[r] + 1];
    cp[r] = std::min<int64_t>(stops[r] - starts[r], fanout);
    op[r + 1] = op[r] + cp[r];
  }
  auto picked = torch::empty({op[m]}, rows.options());
  int64_t* pp = picked.data_ptr<int64_t>();
  const uint64_t k = static_cast<uint64_t>(key);
  at::parallel_for(0, m, 256, [&](int64_t begin, int64_t end) {
    // The row's `take` best (score, CSR position) so far as a max-heap: a candidate that does not beat the
    // worst of them is dropped after one comparison, so a row of degree d costs d scores and about
    // take * log(d / take) heap updates, with no per-candidate buffer.
    std::vector<std::pair<uint64_t, int64_t>> best;
    std::vector<int64_t> chosen;
    // Rows come in no order, so a row's entries and the lines of the id tables they point at are misses: ask
    // for a row's entries kEntriesAhead rows early, and for its columns' ids (original ids where it will be
    // scored, global ids where it keeps every neighbour) kIdsAhead rows early, when its entries have arrived,
    // for at most kIdsPerRow of its entries. sbm60k's sampling at fanouts 15,10,5: 0.29 s an epoch in this
    // kernel against 0.34 without.
    constexpr int64_t kEntriesAhead = 8, kIdsAhead = 4, kIdsPerRow = 16;
    for (int64_t r = begin; r < end; ++r) {
      if (r + kEntriesAhead < end) __builtin_prefetch(ix + starts[r + kEntriesAhead]);
      if (r + kIdsAhead < end) {
        const int64_t first = starts[r + kIdsAhead], stop_ahead = stops[r + kIdsAhead];
        const int64_t last = std::min(stop_ahead, first + kIdsPerRow);
        const int64_t* ids = stop_ahead - first > cp[r + kIdsAhead] ? co : cg;
        for (int64_t e = first; e < last; ++e) __builtin_prefetch(ids + ix[e]);
      }
      const int64_t start = starts[r], stop = stops[r];
      const int64_t take = cp[r];
      int64_t* out = pp + op[r];
      if (stop - start <= take) {
        for (int64_t e = start; e < stop; ++e) *out++ = cg[ix[e]];
        continue;
      }
      const uint64_t target = splitmix64(static_cast<uint64_t>(co[rp[r]]) ^ k);
      best.clear();
      for (int64_t e = start; e < start + take; ++e)
        best.emplace_back(splitmix64(target ^ static_cast<uint64_t>(co[ix[e]])), e);
      std::make_heap(best.begin(), best.end());
      for (int64_t e = start + take; e < stop; ++e) {
        const std::pair<uint64_t, int64_t> candidate(splitmix64(target ^ static_cast<uint64_t>(co[ix[e]])), e);
        if (candidate < best.front()) {
          std::pop_heap(best.begin(), best.end());
          best.back() = candidate;
          std::push_heap(best.begin(), best.end());
        }
      }
      chosen.clear();
      for (const auto& b : best) chosen.push_back(b.second);
      std::sort(chosen.begin(), chosen.end());
      for (int64_t j = 0; j < take; ++j) out[j] = cg[ix[chosen[j]]];
    }
  });
  return {counts, picked};
}

// 4. Relabelling of a sample's hops: the batch's seeds are level 0; each hop's sources that no earlier
// level holds become the next level's new nodes, in order of first appearance, and every source gets its
// position in [all levels so far | new]. One open-addressing table on the 64-bit ids serves a whole
// sample, so a hop inserts only what it adds (the frontier grows ~10x per hop: adding the previous levels
// again each hop was most of the relabelling's time), one probe per source; and the sampler keeps one table
// for all its samples, clearing only the slots a sample filled.
class Relabel {
 public:
  Relabel() { grow(1 << 12); }

  // Start a sample: the seeds are level 0 (a repeated seed's sources point at its last copy).
  void reset(torch::Tensor seeds) {
    on_host({seeds}, "Relabel.reset");
    TORCH_CHECK(seeds.scalar_type() == torch::kInt64 && seeds.is_contiguous(), "Relabel: contiguous int64 seeds");
    for (const uint64_t h : used_) table_[h].key = -1;
    used_.clear();
    const int64_t n = seeds.size(0);
    const int64_t* sp = seeds.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      if (2 * (used_.size() + 1) > table_.size()) grow(2 * table_.size());
      Entry& e = table_[find(sp[i])];
      if (e.key == -1) claim(e, sp[i]);
      e.val = i;
    }
    size_ = n;
  }

  // (new: the sources no level holds yet, in order of first appearance; positions of every source).
  std::vector<torch::Tensor> extend(torch::Tensor sources) {
    on_host({sources}, "Relabel.extend");
    TORCH_CHECK(sources.scalar_type() == torch::kInt64 && sources.is_contiguous(), "Relabel: contiguous int64");
    const int64_t s = sources.size(0);
    const int64_t* sp = sources.data_ptr<int64_t>();
    auto positions = torch::empty({s}, sources.options());
    int64_t* pos = positions.data_ptr<int64_t>();
    const int64_t before = size_;
    std::vector<int64_t> fresh;
    constexpr int64_t kSlotsAhead = 8;  // a later source's slot, asked for early: the probes are misses
    for (int64_t j = 0; j < s; ++j) {
      if (j + kSlotsAhead < s)
        __builtin_prefetch(&table_[splitmix64(static_cast<uint64_t>(sp[j + kSlotsAhead])) & mask_]);
      if (2 * (used_.size() + 1) > table_.size()) grow(2 * table_.size());
      Entry& e = table_[find(sp[j])];
      if (e.key == -1) {
        claim(e, sp[j]);
        e.val = size_++;
        fresh.push_back(sp[j]);
      }
      pos[j] = e.val;
    }
    auto added = torch::empty({size_ - before}, sources.options());
    std::copy(fresh.begin(), fresh.end(), added.data_ptr<int64_t>());
    return {added, positions};
  }

 private:
  struct Entry {
    int64_t key = -1;  // ids are >= 0
    int64_t val = 0;
  };
  std::vector<Entry> table_;
  std::vector<uint64_t> used_;  // the slots this sample filled (cleared by the next reset)
  uint64_t mask_ = 0;
  int64_t size_ = 0;

  uint64_t find(int64_t id) const {  // the slot holding id, or the empty slot where it belongs
    uint64_t h = splitmix64(static_cast<uint64_t>(id)) & mask_;
    while (table_[h].key != -1 && table_[h].key != id) h = (h + 1) & mask_;
    return h;
  }
  void claim(Entry& e, int64_t id) {
    e.key = id;
    used_.push_back(static_cast<uint64_t>(&e - table_.data()));
  }
  void grow(size_t capacity) {  // a power of two, at most half full
    std::vector<Entry> old(capacity);
    old.swap(table_);
    mask_ = capacity - 1;
    std::vector<uint64_t> slots;
    slots.swap(used_);
    for (const uint64_t h : slots) {
      Entry& e = table_[find(old[h].key)];
      claim(e, old[h].key);
      e.val = old[h].val;
    }
  }
};

// 5. Graph attention (GAT) over a CSR of destination rows: for row i, head h and entry k (column j),
//      z = a_src[j, h] + a_dst[i, h],  e = leaky_relu(z, slope),  alpha = softmax of e over the row,
//      out[i, h, :] = sum_k alpha * keep(i, j, h) * x[j, h, :] (+ bias).
// A `source` row is [x (heads * width) | a_src (heads)]: the layout one halo exchange moves. No
// [E x H x C] tensor exists: the forward keeps lse[i, h] (the log of the row's softmax denominator) and
// the backward recomputes alpha from it. keep() is the attention dropout, hashed from the endpoints' keys
// as gnn_dist/kernels/attention.py does, so no mask is stored either.
struct EdgeDropout {
  const uint32_t* dst_hash;
  const uint32_t* src_hash;
  const uint32_t* head_hash;
  int32_t threshold;
  double scale;
  bool on;
  template <typename scalar_t>
  inline scalar_t keep(int64_t i, int64_t j, int64_t h) const {
    if (!on) return scalar_t(1);
    return static_cast<int32_t>(mix32(dst_hash[i] ^ src_hash[j] ^ head_hash[h])) >= threshold
               ? static_cast<scalar_t>(scale) : scalar_t(0);
  }
};

static EdgeDropout edge_dropout(const torch::Tensor& dst_hash, const torch::Tensor& src_hash,
                                const torch::Tensor& head_hash, int64_t threshold, double scale, bool on) {
  if (on)
    TORCH_CHECK(dst_hash.scalar_type() == torch::kInt32 && src_hash.scalar_type() == torch::kInt32 &&
                head_hash.scalar_type() == torch::kInt32, "attention dropout hashes: int32");
  return EdgeDropout{on ? reinterpret_cast<const uint32_t*>(dst_hash.data_ptr<int32_t>()) : nullptr,
                     on ? reinterpret_cast<const uint32_t*>(src_hash.data_ptr<int32_t>()) : nullptr,
                     on ? reinterpret_cast<const uint32_t*>(head_hash.data_ptr<int32_t>()) : nullptr,
                     static_cast<int32_t>(threshold), scale, on};
}

template <typename scalar_t>
static inline scalar_t leaky(scalar_t z, scalar_t slope) { return z > 0 ? z : slope * z; }

template <typename scalar_t, typename index_t>
static void attention_forward_typed(const torch::Tensor& crow, const torch::Tensor& col, const torch::Tensor& source,
                                    const torch::Tensor& dst_score, const scalar_t* bias, int64_t heads,
                                    scalar_t slope, const EdgeDropout& drop, torch::Tensor& out, torch::Tensor& lse) {
  const int64_t rows = crow.size(0) - 1, stride = source.size(1), hc = stride - heads, width = hc / heads;
  const index_t* cp = crow.data_ptr<index_t>();
  const index_t* ip = col.data_ptr<index_t>();
  const scalar_t* src = source.data_ptr<scalar_t>();
  const scalar_t* ad = dst_score.data_ptr<scalar_t>();
  scalar_t* y = out.data_ptr<scalar_t>();
  scalar_t* l = lse.data_ptr<scalar_t>();
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    std::vector<scalar_t> e, mx(heads), sum(heads);
    const int64_t ahead_limit = cp[end];
    for (int64_t i = begin; i < end; ++i) {
      const int64_t start = cp[i], stop = cp[i + 1];
      scalar_t* yi = y + i * hc;
      for (int64_t f = 0; f < hc; ++f) yi[f] = scalar_t(0);
      e.resize((stop - start) * heads);
      for (int64_t h = 0; h < heads; ++h) mx[h] = -std::numeric_limits<scalar_t>::infinity(), sum[h] = 0;
      for (int64_t k = start; k < stop; ++k) {
        // the whole source row of an entry ahead: its score now, its x in the second pass over the row
        prefetch_entry_row(src, ip, k + kAhead, ahead_limit, 0, stride);
        const scalar_t* sj = src + static_cast<int64_t>(ip[k]) * stride + hc;
        for (int64_t h = 0; h < heads; ++h) {
          const scalar_t v = leaky(sj[h] + ad[i * heads + h], slope);
          e[(k - start) * heads + h] = v;
          mx[h] = v > mx[h] ? v : mx[h];
        }
      }
      for (int64_t k = start; k < stop; ++k) {
        const int64_t j = ip[k];
        const scalar_t* xj = src + j * stride;
        for (int64_t h = 0; h < heads; ++h) {
          const scalar_t w = std::exp(e[(k - start) * heads + h] - mx[h]);
          sum[h] += w;
          const scalar_t a = w * drop.keep<scalar_t>(i, j, h);
          if (a == scalar_t(0)) continue;
          scalar_t* __restrict__ o = yi + h * width;
          const scalar_t* __restrict__ x = xj + h * width;
          for (int64_t f = 0; f < width; ++f) o[f] += a * x[f];
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        if (sum[h] > 0) {
          const scalar_t inv = scalar_t(1) / sum[h];
          for (int64_t f = 0; f < width; ++f) yi[h * width + f] *= inv;
          l[i * heads + h] = mx[h] + std::log(sum[h]);
        } else {
          l[i * heads + h] = -std::numeric_limits<scalar_t>::infinity();  // no entry in this row
        }
      }
      if (bias != nullptr)
        for (int64_t f = 0; f < hc; ++f) yi[f] += bias[f];
    }
  });
}

// Returns {out [rows, heads * width], lse [rows, heads]}.
std::vector<torch::Tensor> attention_forward(torch::Tensor crow, torch::Tensor col, torch::Tensor source,
                                             torch::Tensor dst_score, c10::optional<torch::Tensor> bias,
                                             int64_t heads, double slope, torch::Tensor dst_hash,
                                             torch::Tensor src_hash, torch::Tensor head_hash, int64_t threshold,
                                             double scale, bool dropout) {
  on_host({crow, col, source, dst_score, dst_hash, src_hash, head_hash}, "attention_forward");
  if (bias) on_host({*bias}, "attention_forward");
  TORCH_CHECK(source.dim() == 2 && source.is_contiguous() && dst_score.is_contiguous(), "contiguous source, scores");
  TORCH_CHECK(heads >= 1 && (source.size(1) - heads) % heads == 0, "source rows: heads * width features, then heads scores");
  TORCH_CHECK(crow.scalar_type() == col.scalar_type(), "crow and col: one index dtype");
  TORCH_CHECK(dst_score.scalar_type() == source.scalar_type(), "one float dtype");
  const int64_t rows = crow.size(0) - 1, hc = source.size(1) - heads;
  TORCH_CHECK(dst_score.size(0) == rows && dst_score.size(1) == heads, "dst_score: [rows, heads]");
  auto out = torch::empty({rows, hc}, source.options());
  auto lse = torch::empty({rows, heads}, source.options());
  const EdgeDropout drop = edge_dropout(dst_hash, src_hash, head_hash, threshold, scale, dropout);
  AT_DISPATCH_FLOATING_TYPES(source.scalar_type(), "attention_forward", [&] {
    const scalar_t* b = bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr;
    if (crow.scalar_type() == torch::kInt32)
      attention_forward_typed<scalar_t, int32_t>(crow, col, source, dst_score, b, heads, slope, drop, out, lse);
    else
      attention_forward_typed<scalar_t, int64_t>(crow, col, source, dst_score, b, heads, slope, drop, out, lse);
  });
  return {out, lse};
}

template <typename scalar_t, typename index_t>
static void attention_backward_typed(const torch::Tensor& crow, const torch::Tensor& col, const torch::Tensor& t_crow,
                                     const torch::Tensor& t_row, const torch::Tensor& t_perm,
                                     const torch::Tensor& source, const torch::Tensor& dst_score,
                                     const torch::Tensor& lse, const torch::Tensor& grad_out,
                                     const scalar_t* grad_lse, const scalar_t* row_delta, int64_t heads,
                                     scalar_t slope, const EdgeDropout& drop,
                                     torch::Tensor& grad_source, torch::Tensor& grad_dst) {
  const int64_t rows = crow.size(0) - 1, cols = t_crow.size(0) - 1, stride = source.size(1), hc = stride - heads,
                width = hc / heads, nnz = col.size(0);
  const index_t* cp = crow.data_ptr<index_t>();
  const index_t* ip = col.data_ptr<index_t>();
  const index_t* tcp = t_crow.data_ptr<index_t>();
  const index_t* trp = t_row.data_ptr<index_t>();
  const index_t* tpp = t_perm.data_ptr<index_t>();
  const scalar_t* src = source.data_ptr<scalar_t>();
  const scalar_t* ad = dst_score.data_ptr<scalar_t>();
  const scalar_t* l = lse.data_ptr<scalar_t>();
  const scalar_t* g = grad_out.data_ptr<scalar_t>();
  scalar_t* gd = grad_dst.data_ptr<scalar_t>();
  scalar_t* gs = grad_source.data_ptr<scalar_t>();
  // Per entry and head: the weight applied to x (alpha * keep) and dL/dz. [E x H], never [E x H x C].
  std::vector<scalar_t> weight(nnz * heads), dz(nnz * heads);
  // Pass 1, over destination rows: softmax backward needs the row's sum of alpha * dL/dalpha first.
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    std::vector<scalar_t> delta(heads);
    const int64_t ahead_limit = cp[end];
    for (int64_t i = begin; i < end; ++i) {
      const int64_t start = cp[i], stop = cp[i + 1];
      const scalar_t* gi = g + i * hc;
      for (int64_t h = 0; h < heads; ++h) delta[h] = grad_lse != nullptr ? -grad_lse[i * heads + h] : scalar_t(0);
      for (int64_t k = start; k < stop; ++k) {
        prefetch_entry_row(src, ip, k + kAhead, ahead_limit, 0, stride);
        const int64_t j = ip[k];
        const scalar_t* xj = src + j * stride;
        for (int64_t h = 0; h < heads; ++h) {
          const scalar_t alpha = std::exp(leaky(xj[hc + h] + ad[i * heads + h], slope) - l[i * heads + h]);
          const scalar_t kept = drop.keep<scalar_t>(i, j, h);
          scalar_t dot = 0;
          if (kept != scalar_t(0)) {
            const scalar_t* __restrict__ x = xj + h * width;
            const scalar_t* __restrict__ gh = gi + h * width;
            for (int64_t f = 0; f < width; ++f) dot += x[f] * gh[f];
            dot *= kept;
          }
          weight[k * heads + h] = alpha;  // alpha * keep after the second loop
          dz[k * heads + h] = dot;        // dL/dalpha until the second loop
          delta[h] += alpha * dot;
        }
      }
      if (row_delta != nullptr)  // the row's sum over all its columns, when this CSR holds only some of them
        for (int64_t h = 0; h < heads; ++h) delta[h] = row_delta[i * heads + h];
      for (int64_t h = 0; h < heads; ++h) gd[i * heads + h] = 0;
      for (int64_t k = start; k < stop; ++k) {
        const int64_t j = ip[k];
        const scalar_t* xj = src + j * stride;
        for (int64_t h = 0; h < heads; ++h) {
          const scalar_t z = xj[hc + h] + ad[i * heads + h];
          const scalar_t alpha = weight[k * heads + h];
          const scalar_t de = alpha * (dz[k * heads + h] - delta[h]);
          const scalar_t d = z > 0 ? de : slope * de;
          dz[k * heads + h] = d;
          gd[i * heads + h] += d;
          if (drop.on) weight[k * heads + h] = alpha * drop.keep<scalar_t>(i, j, h);
        }
      }
    }
  });
  // Pass 2, over source columns (the transpose): each source row gathers its gradient, no atomics.
  at::parallel_for(0, cols, 64, [&](int64_t begin, int64_t end) {
    const int64_t ahead_limit = tcp[end];
    for (int64_t j = begin; j < end; ++j) {
      scalar_t* gj = gs + j * stride;
      for (int64_t f = 0; f < stride; ++f) gj[f] = scalar_t(0);
      for (int64_t t = tcp[j]; t < tcp[j + 1]; ++t) {
        prefetch_entry_row(g, trp, t + kAhead, ahead_limit, 0, hc);
        const int64_t i = trp[t], k = tpp[t];
        const scalar_t* gi = g + i * hc;
        for (int64_t h = 0; h < heads; ++h) {
          gj[hc + h] += dz[k * heads + h];
          const scalar_t a = weight[k * heads + h];
          if (a == scalar_t(0)) continue;
          scalar_t* __restrict__ o = gj + h * width;
          const scalar_t* __restrict__ gh = gi + h * width;
          for (int64_t f = 0; f < width; ++f) o[f] += a * gh[f];
        }
      }
    }
  });
}

// Returns {grad_source [cols, heads * width + heads], grad_dst_score [rows, heads]}. grad_lse (optional) is
// the gradient reaching lse itself, when partial results over column blocks are merged by their lse.
// row_delta (optional) is sum over the row's entries of alpha * dL/dalpha when this CSR holds only some of the
// row's columns (a block of halo columns); lse is then the whole row's, so alpha is the whole row's softmax.
std::vector<torch::Tensor> attention_backward(torch::Tensor crow, torch::Tensor col, torch::Tensor t_crow,
                                              torch::Tensor t_row, torch::Tensor t_perm, torch::Tensor source,
                                              torch::Tensor dst_score, torch::Tensor lse, torch::Tensor grad_out,
                                              c10::optional<torch::Tensor> grad_lse,
                                              c10::optional<torch::Tensor> row_delta, int64_t heads, double slope,
                                              torch::Tensor dst_hash, torch::Tensor src_hash, torch::Tensor head_hash,
                                              int64_t threshold, double scale, bool dropout) {
  on_host({crow, col, t_crow, t_row, t_perm, source, dst_score, lse, grad_out, dst_hash, src_hash, head_hash},
          "attention_backward");
  if (grad_lse) on_host({*grad_lse}, "attention_backward");
  if (row_delta) on_host({*row_delta}, "attention_backward");
  TORCH_CHECK(grad_out.is_contiguous() && source.is_contiguous() && lse.is_contiguous(), "contiguous inputs");
  for (const auto& t : {col, t_crow, t_row, t_perm})
    TORCH_CHECK(t.scalar_type() == crow.scalar_type(), "one index dtype for the CSR and its transpose");
  auto grad_source = torch::empty_like(source);
  auto grad_dst = torch::empty_like(dst_score);
  const EdgeDropout drop = edge_dropout(dst_hash, src_hash, head_hash, threshold, scale, dropout);
  AT_DISPATCH_FLOATING_TYPES(source.scalar_type(), "attention_backward", [&] {
    const scalar_t* gl = grad_lse.has_value() ? grad_lse->data_ptr<scalar_t>() : nullptr;
    const scalar_t* rd = row_delta.has_value() ? row_delta->data_ptr<scalar_t>() : nullptr;
    if (crow.scalar_type() == torch::kInt32)
      attention_backward_typed<scalar_t, int32_t>(crow, col, t_crow, t_row, t_perm, source, dst_score, lse, grad_out,
                                                  gl, rd, heads, slope, drop, grad_source, grad_dst);
    else
      attention_backward_typed<scalar_t, int64_t>(crow, col, t_crow, t_row, t_perm, source, dst_score, lse, grad_out,
                                                  gl, rd, heads, slope, drop, grad_source, grad_dst);
  });
  return {grad_source, grad_dst};
}

// kernels/workspace_allocator.cpp
void install_workspace_allocator(int64_t threshold_bytes, double slack, int64_t huge_pages_from_bytes);
std::unordered_map<std::string, int64_t> workspace_stats();
void release_workspace();

// The compute kernels release the GIL while they run (tensors in, tensors out; nothing touches Python), so the
// rank's other threads (the peer monitor that names a lost host, the watchdog) run during a long kernel
// instead of waiting for it: a host loss is named before the launcher's teardown reaches this rank.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto without_gil = py::call_guard<py::gil_scoped_release>();
  m.def("install_workspace_allocator", &install_workspace_allocator,
        "serve CPU tensors of at least threshold bytes from a cache of blocks freed earlier");
  m.def("workspace_stats", &workspace_stats, "the workspace allocator's counters");
  m.def("release_workspace", &release_workspace, "unmap the workspace's cached blocks");
  m.def("attention_forward", &attention_forward, "GAT edge softmax and aggregation over a CSR", without_gil);
  m.def("attention_backward", &attention_backward, "its backward, recomputing the attention", without_gil);
  py::class_<Relabel>(m, "Relabel")
      .def(py::init<>(), "the relabelling of a sampler's samples, one at a time")
      .def("reset", &Relabel::reset, "start a sample: its seeds are level 0", without_gil)
      .def("extend", &Relabel::extend, "a hop's new nodes and every source's position", without_gil);
  m.def("sample_rows", &sample_rows, "keyed uniform neighbour sampling without replacement", without_gil);
  m.def("csr_spmm", &csr_spmm, "CSR sparse x dense (+ bias)", without_gil);
  m.def("csr_spmm_into", &csr_spmm_into, "rows of a CSR product from per-row entry ranges, into y (or added)",
        without_gil);
  m.def("sparse_adam_rows", &sparse_adam_rows, "SparseAdam's update of listed rows, in place", without_gil);
  m.def("masked_scale", &masked_scale, "grad * mask * scale (keyed dropout's backward)", without_gil);
  m.def("keyed_dropout", &keyed_dropout, "keyed dropout, optionally fused with the preceding ReLU", without_gil);
}
