"""convs2s.distributed: the processes of one torchrun round agree on its number through torchrun's
store, whatever earlier rounds left there (their keys, their hellos, a node's restart count)."""

import subprocess
import sys
import time

import torch.distributed as dist

MEMBER = """
import sys, time, torch.distributed as dist
from convs2s.distributed import _agree_round
port, rank, world = map(int, sys.argv[1:])
store = dist.TCPStore("127.0.0.1", port, is_master=False)
number = _agree_round(store, rank)
store.add(f"agreed{number}", 1)
while rank == 0 and store.add(f"agreed{number}", 0) < world:  # as in a group: rank 0 lives on meanwhile
    time.sleep(0.05)
print(number)
"""
STALE_HELLO = """
import sys, torch.distributed as dist
from convs2s.distributed import _answered
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False)
slot = _answered(store) + 1
while store.compare_set(f"convs2s/hello/{slot}", "", "a-dead-process") != b"a-dead-process":
    slot += 1
"""


def round_of_processes(port: int, ranks, rank0_late: float) -> dict:
    """One process per rank (rank 0 started ``rank0_late`` s after the others), each one's round."""
    start = lambda rank: subprocess.Popen([sys.executable, "-c", MEMBER, str(port), str(rank), str(len(ranks))],  # noqa: E731
                                          stdout=subprocess.PIPE, text=True)
    procs = {r: start(r) for r in ranks if r != 0}
    time.sleep(rank0_late)
    procs[0] = start(0)
    said = {r: p.communicate(timeout=120)[0].strip() for r, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), said
    return {r: int(s) for r, s in said.items()}


def test_the_processes_of_a_round_agree_on_its_number():
    """The agent's store outlives its rounds: the second round's processes (rank 0 late, a dead
    process's hello nobody answered left before them) all say 2, none reads round 1's answers."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    assert round_of_processes(server.port, range(3), rank0_late=0.0) == {0: 1, 1: 1, 2: 1}
    subprocess.run([sys.executable, "-c", STALE_HELLO, str(server.port)], check=True, timeout=60)
    assert round_of_processes(server.port, range(3), rank0_late=1.0) == {0: 2, 1: 2, 2: 2}
    assert round_of_processes(server.port, range(2), rank0_late=0.0) == {0: 3, 1: 3}
