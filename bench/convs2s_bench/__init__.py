"""convs2s_bench: the benchmarks of convs2s, beside the suites that use them.

* :mod:`convs2s_bench.speed_table` — the paper's generation-speed table (Table 3), estimated from
  a timed sample (:mod:`.estimate`) or run in full, on the workload of :mod:`.workload`, drawn by
  :mod:`.plot`;
* :mod:`convs2s_bench.vs_fairseq` — fairseq's own generator beside convs2s (fairseq runs
  :mod:`.fairseq_driver`, a script, in its own interpreter);
* :mod:`convs2s_bench.compare` — pytest-benchmark results pivoted across machines;
* :mod:`convs2s_bench.flops` — the FLOP and byte models of generation;
* :mod:`convs2s_bench.roofline` — the machine's measured peaks (GEMM, copy bandwidth);
* :mod:`convs2s_bench.harness` — helpers of the pytest-benchmark suites under ``bench/``;
* :mod:`convs2s_bench.cli` — the ``convs2s bench`` commands, which ``convs2s.cli`` imports only
  when one of them runs.

The package imports nothing here: the suites import :mod:`.harness` before ``convs2s_kernels``
(whose import reads ``TRITON_INTERPRET``).
"""
