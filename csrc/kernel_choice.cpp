// The measured crossovers: few-row kernels against the GEMM, and which library's GEMM (see kernel_choice.h).

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

typedef std::vector<std::pair<int64_t, bool>> LibraryRanges;  // (max rows, -1: no end; oneDNN?)

std::map<Key, LibraryRanges>& library_choices() {
  static std::map<Key, LibraryRanges> table;
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
  library_choices().clear();
}

void set_gemm_library_choice(int64_t form, at::ScalarType weight_dtype, int64_t K, int64_t N,
                             const std::vector<int64_t>& max_rows, const std::vector<bool>& onednn) {
  TORCH_CHECK(form == 0 || form == 1 || form == 3, "a GEMM library is chosen for forms 0 (nk), 1 (kn) and 3 (kp)");
  TORCH_CHECK(weight_dtype == at::kFloat, "a GEMM library is chosen for float32 weights only");
  TORCH_CHECK(!max_rows.empty() && max_rows.size() == onednn.size(),
              "the GEMM library choice needs one flag per row range, and at least one range");
  LibraryRanges ranges;
  for (size_t i = 0; i < max_rows.size(); ++i) {
    const bool last = i + 1 == max_rows.size();
    TORCH_CHECK(last ? max_rows[i] == -1 : max_rows[i] >= 1 && (i == 0 || max_rows[i] > max_rows[i - 1]),
                "row ranges end at increasing row counts, the last at -1 (no end)");
    ranges.emplace_back(max_rows[i], onednn[i]);
  }
  std::lock_guard<std::mutex> guard(choices_mutex());
  library_choices()[key_of(form, weight_dtype, K, N)] = ranges;
}

bool use_onednn_gemm(Form form, at::ScalarType weight_dtype, int64_t K, int64_t N, int64_t rows) {
  std::lock_guard<std::mutex> guard(choices_mutex());
  const auto it = library_choices().find(key_of(static_cast<int64_t>(form), weight_dtype, K, N));
  if (it == library_choices().end()) return false;
  for (const auto& [max_rows, onednn] : it->second)
    if (max_rows == -1 || rows <= max_rows) return onednn;
  return false;
}

std::vector<std::tuple<int64_t, std::string, int64_t, int64_t, std::vector<int64_t>, std::vector<bool>>>
gemm_library_choices() {
  std::lock_guard<std::mutex> guard(choices_mutex());
  std::vector<std::tuple<int64_t, std::string, int64_t, int64_t, std::vector<int64_t>, std::vector<bool>>> out;
  for (const auto& [key, ranges] : library_choices()) {
    std::vector<int64_t> max_rows;
    std::vector<bool> onednn;
    for (const auto& [m, o] : ranges) {
      max_rows.push_back(m);
      onednn.push_back(o);
    }
    out.emplace_back(std::get<0>(key), dtype_name(std::get<1>(key)), std::get<2>(key), std::get<3>(key), max_rows,
                     onednn);
  }
  return out;
}

std::vector<std::tuple<int64_t, std::string, int64_t, int64_t, std::vector<bool>>> few_rows_choices() {
  std::lock_guard<std::mutex> guard(choices_mutex());
  std::vector<std::tuple<int64_t, std::string, int64_t, int64_t, std::vector<bool>>> out;
  for (const auto& [key, rows] : choices())
    out.emplace_back(std::get<0>(key), dtype_name(std::get<1>(key)), std::get<2>(key), std::get<3>(key), rows);
  return out;
}

}  // namespace convs2s
