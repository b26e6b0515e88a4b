"""What a run compiles: (launch, config, dtype, target) jobs for the whole matrix, the CI subset
or candidate configs (``--try``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

from ..triton_common.fits import KERNEL_MODULES
from .launches import Launch, collect_launches, config_name, subset_extra

TARGETS = ("sm_80", "sm_90")
DTYPES = ("bf16", "fp16", "fp32-ieee", "fp32-tf32")
# what --ci and --subset compile when the report is current: each launch's first config in this
# dtype on this target, plus the recipes' SUBSET_EXTRA
SUBSET_DTYPE, SUBSET_TARGET = "bf16", "sm_90"


@dataclass
class Job:
    launch: Launch
    config: Dict[str, Any]
    dtype: str
    target: str

    @property
    def key(self) -> Tuple[str, str, str, str]:
        return (self.launch.name, config_name(self.config), self.dtype, self.target)


def build_jobs(modules: Sequence[str], dtypes: Sequence[str], targets: Sequence[str]) -> List[Job]:
    jobs = []
    for dtype in dtypes:
        for launch in collect_launches(modules, dtype):
            for config in launch.configs:
                for target in targets:
                    jobs.append(Job(launch, config, dtype, target))
    return jobs


def subset_jobs(modules: Sequence[str]) -> List[Job]:
    """The fixed CI subset: each launch's first config in bf16 on sm_90, plus each recipe's
    ``SUBSET_EXTRA``."""
    jobs = [Job(launch, launch.configs[0], SUBSET_DTYPE, SUBSET_TARGET)
            for launch in collect_launches(modules, SUBSET_DTYPE)]
    for module in modules:
        for name, index, dtype, target in subset_extra(module):
            for launch in collect_launches([module], dtype):
                if launch.name == name:
                    jobs.append(Job(launch, launch.configs[index], dtype, target))
    return jobs


def parse_try(spec: str) -> Tuple[str, Dict[str, Any]]:
    """``LAUNCH:NAME=V,...`` (``--try``) -> (launch name, config dict with num_warps/num_stages)."""
    launch, _, body = spec.rpartition(":")
    if not launch or not body:
        raise ValueError(f"--try {spec!r}: expected LAUNCH:BLOCK_M=64,...,num_warps=4,num_stages=3")
    cfg: Dict[str, Any] = {}
    for item in body.split(","):
        k, _, v = item.partition("=")
        cfg[k.strip()] = int(v)
    blocks = {k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages")}
    return launch, dict(blocks, num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3))


def try_jobs(specs: Sequence[str], dtypes: Sequence[str], targets: Sequence[str]) -> List[Job]:
    """Jobs for candidate configs (``--try``): each on the named launch, every dtype and target."""
    jobs = []
    for spec in specs:
        name, cfg = parse_try(spec)
        module = name.split("/")[0]
        if module not in KERNEL_MODULES:
            raise ValueError(f"--try {spec!r}: unknown kernel module {module!r}")
        for dtype in dtypes:
            launch = next((l for l in collect_launches([module], dtype) if l.name == name), None)
            if launch is None:
                names = sorted({l.name for l in collect_launches([module], dtype)})
                raise ValueError(f"--try {spec!r}: no launch {name!r}; {module} has {names}")
            jobs += [Job(launch, cfg, dtype, target) for target in targets]
    return jobs
