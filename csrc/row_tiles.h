// Register tiles of a compile-time row count for the CPU kernels (small_gemm.cpp, linear_w8a8_*.cpp).
#pragma once

// Calls TILE<M> for the rows of one tile (1..MAX), M a compile-time constant.
#define CONVS2S_ROWS_SWITCH(ROWS, MAX, CALL)                            \
  switch (ROWS) {                                                      \
    case 1: { constexpr int M = 1; CALL; break; }                      \
    case 2: { if constexpr (MAX >= 2) { constexpr int M = 2; CALL; } break; } \
    case 3: { if constexpr (MAX >= 3) { constexpr int M = 3; CALL; } break; } \
    case 4: { if constexpr (MAX >= 4) { constexpr int M = 4; CALL; } break; } \
    case 5: { if constexpr (MAX >= 5) { constexpr int M = 5; CALL; } break; } \
    case 6: { if constexpr (MAX >= 6) { constexpr int M = 6; CALL; } break; } \
    case 7: { if constexpr (MAX >= 7) { constexpr int M = 7; CALL; } break; } \
    default: { if constexpr (MAX >= 8) { constexpr int M = 8; CALL; } break; } \
  }
