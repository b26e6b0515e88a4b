// Which product runs a call with few rows: the streaming kernels (small_gemm.cpp) or ATen's GEMM
// (MKL / oneDNN); for int8 x int8 products on a packed weight (linear_w8a8_cpu.cpp), the packed
// int8 kernel or its alternative (the library's int8 GEMM where exact, else the reducing kernel,
// and linear_w8a8's own rules where unmeasured). The crossover depends on the CPU, its instruction set, the thread count and
// the weight's shape, so it is measured (convs2s_kernels.tune) and set here per weight shape; a
// shape never measured takes the kernels up to kDefaultFewRows rows.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace convs2s {

// The weight's layout: (N, K) as nn.Linear stores it, or (K, N) as the linearised conv weight;
// w8a8: an int8 (N, K) weight times int8 activations (linear_w8a8); w7a8: the same weight times 7-bit
// activations, measured apart (the AVX2 packed kernel runs 7 bits with a quarter fewer instructions,
// the reducing kernel no faster, so the crossover moves:
// bench/results/kernel-decisions.md#kernel-choice-w7a8-form). 7-bit weights take w7a8's choice:
// they only make the packed kernel faster, so where it won it wins again.
// kp: a (K, N) weight packed by pack_kn_weight (small_gemm_kn_packed) against ATen's GEMM on the weight
enum class Form : int64_t { nk = 0, kn = 1, w8a8 = 2, kp = 3, w7a8 = 4 };

constexpr int64_t kDefaultFewRows = 8;

// True when `rows` rows against this weight should run on the few-row kernels (w8a8, w7a8: the
// packed int8 kernel, linear_w8a8_avx2.cpp).
bool use_few_rows(Form form, at::ScalarType weight_dtype, int64_t K, int64_t N, int64_t rows);
// The measured choice for `rows` rows against this weight (false past 1..kSmallGemmMaxRows), or
// nothing where the shape was never measured.
std::optional<bool> measured_few_rows(Form form, at::ScalarType weight_dtype, int64_t K, int64_t N, int64_t rows);

// Measured choices (convs2s_kernels.tune): kernel_rows[r - 1] says whether r rows run the few-row
// kernels, for r in 1..kSmallGemmMaxRows.
void set_few_rows_choice(int64_t form, at::ScalarType weight_dtype, int64_t K, int64_t N,
                         const std::vector<bool>& kernel_rows);
void clear_few_rows_choices();
// (form, dtype name, K, N, kernel_rows) for every measured shape.
std::vector<std::tuple<int64_t, std::string, int64_t, int64_t, std::vector<bool>>> few_rows_choices();

// Which library's GEMM takes the rows the few-row kernels do not (library_gemm.h), measured per
// float32 weight shape at a few row counts: row ranges, each up to max_rows[i] (-1: no end, the
// last), and whether oneDNN took it (else ATen's BLAS). A shape never measured: ATen's.
void set_gemm_library_choice(int64_t form, at::ScalarType weight_dtype, int64_t K, int64_t N,
                             const std::vector<int64_t>& max_rows, const std::vector<bool>& onednn);
bool use_onednn_gemm(Form form, at::ScalarType weight_dtype, int64_t K, int64_t N, int64_t rows);
// (form, dtype name, K, N, max_rows, onednn) for every shape with a library choice.
std::vector<std::tuple<int64_t, std::string, int64_t, int64_t, std::vector<int64_t>, std::vector<bool>>>
gemm_library_choices();

}  // namespace convs2s
