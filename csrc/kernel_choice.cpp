// The measured crossover between the few-row kernels and ATen's GEMM (see kernel_choice.h).

#include "kernel_choice.h"
#include "small_gemm.h"

#include <map>
#include <mutex>
#include <tuple>

namespace convs2s {

namespace {

typedef std::tuple<int64_t, int64_t, int64_t, int64_t> Key;  // form, dtype, K, N

std::mutex& choices_mutex() {
  static std::mutex m;
  return m;
}

std::map<Key, std::vector<bool>>& choices() {
  static std::map<Key, std::vector<bool>> table;
  return table;
}

const char* dtype_name(int64_t dtype) {
  switch (static_cast<at::ScalarType>(dtype)) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kChar: return "int8";
    default: return "other";
  }
}

Key key_of(int64_t form, at::ScalarType dtype, int64_t K, int64_t N) {
  return Key{form, static_cast<int64_t>(dtype), K, N};
}

}  // namespace

std::optional<bool> measured_few_rows(Form form, at::ScalarType weight_dtype, int64_t K, int64_t N, int64_t rows) {
  std::lock_guard<std::mutex> guard(choices_mutex());
  const auto it = choices().find(key_of(static_cast<int64_t>(form), weight_dtype, K, N));
  if (it == choices().end()) return std::nullopt;
  return rows >= 1 && rows <= kSmallGemmMaxRows && it->second[rows - 1];  // past the measured rows: not the kernels
}

bool use_few_rows(Form form, at::ScalarType weight_dtype, int64_t K, int64_t N, int64_t rows) {
  if (rows < 1 || rows > kSmallGemmMaxRows) return false;
  return measured_few_rows(form, weight_dtype, K, N, rows).value_or(rows <= kDefaultFewRows);
}

void set_few_rows_choice(int64_t form, at::ScalarType weight_dtype, int64_t K, int64_t N,
                         const std::vector<bool>& kernel_rows) {
  TORCH_CHECK(form >= 0 && form <= 4,
              "form is 0 (nk), 1 (kn), 2 (w8a8), 3 (kp: packed (K, N)) or 4 (w7a8: 7-bit activations)");
  TORCH_CHECK(form != 3 || weight_dtype != at::kChar, "form 3 (kp) takes float32 or bf16 weights");
  TORCH_CHECK((form != 2 && form != 4) || weight_dtype == at::kChar, "forms 2 (w8a8) and 4 (w7a8) take int8 weights");
  TORCH_CHECK(static_cast<int64_t>(kernel_rows.size()) == kSmallGemmMaxRows, "the choice needs one entry per row count 1..",
              kSmallGemmMaxRows);
  std::lock_guard<std::mutex> guard(choices_mutex());
  choices()[key_of(form, weight_dtype, K, N)] = kernel_rows;
}

void clear_few_rows_choices() {
  std::lock_guard<std::mutex> guard(choices_mutex());
  choices().clear();
}

std::vector<std::tuple<int64_t, std::string, int64_t, int64_t, std::vector<bool>>> few_rows_choices() {
  std::lock_guard<std::mutex> guard(choices_mutex());
  std::vector<std::tuple<int64_t, std::string, int64_t, int64_t, std::vector<bool>>> out;
  for (const auto& [key, rows] : choices())
    out.emplace_back(std::get<0>(key), dtype_name(std::get<1>(key)), std::get<2>(key), std::get<3>(key), rows);
  return out;
}

}  // namespace convs2s
