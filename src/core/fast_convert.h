// Bulk 16-bit float conversions on the CPU.  Results are bit-identical to the
// scalar reference in tutti/dtype.h (round to nearest even, NaN kept, Inf on
// overflow, exact subnormals); F16C is used when the CPU has it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti {

void f32_to_f16(const float* src, uint16_t* dst, size_t n);
void f16_to_f32(const uint16_t* src, float* dst, size_t n);
void f32_to_bf16(const float* src, uint16_t* dst, size_t n);
void bf16_to_f32(const uint16_t* src, float* dst, size_t n);

}  // namespace tutti
