import sys

from .allocator import reexec_with_fast_allocator

if __name__ == "__main__":
    reexec_with_fast_allocator(sys.argv[1:])  # tcmalloc/jemalloc when installed (convs2s.allocator)
    from .cli import main

    raise SystemExit(main())
