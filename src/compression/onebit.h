// 1-bit sign compression with error feedback (EF-SignSGD, Karimireddy et al.
// 2019; the compression of 1-bit Adam, Tang et al. 2021).
//
// Each rank adds its residual to the gradient, splits the result into chunks
// and sends, per chunk, one float32 scale (the chunk's mean |x|) and one
// sign bit per element (32 to a uint32 word); the residual keeps what the
// signs did not carry: x - (bit ? scale : -scale).  The blocks are
// all-gathered and every rank decodes and sums them in rank order in one
// fused pass, so the average is bit-identical everywhere.
#pragma once

#include <memory>

#include "compression/common.h"

namespace tutti {
namespace compression {

// Words of one rank's block for n elements and chunk size `chunk` (a
// multiple of 32): ceil(n / chunk) scales, then ceil(n / 32) sign words.
int64_t onebit_chunks(int64_t n, int64_t chunk);
int64_t onebit_block_words(int64_t n, int64_t chunk);

// CPU reference of the encoder.  x holds grad + residual on entry and the
// new residual on return; block receives the scales (float32 bits) and the
// sign words (bit b of word w is element 32w + b: 1 for x >= 0 or NaN).
void onebit_encode_cpu(float* x, int64_t n, int64_t chunk, uint32_t* block);

// CPU reference of the fused decoder: out[i] = dtype((sum over ranks r in
// order of +-scale_r) / divisor), from `world` consecutive blocks.
void onebit_decode_sum_cpu(const uint32_t* blocks, int world, int64_t n,
                           int64_t chunk, float divisor, void* out,
                           DType dtype);

// chunk: elements per scale, a positive multiple of 32.
std::shared_ptr<BucketCompressor> make_onebit_compressor(int64_t chunk);

}  // namespace compression
}  // namespace tutti
