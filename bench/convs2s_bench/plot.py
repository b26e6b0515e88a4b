"""Draw the speed table: seconds for the set per configuration, beam 1 and beam 5, beside the
paper's Table 3 rows (matplotlib; a log scale, since the rows span two orders of magnitude)."""

from __future__ import annotations

from convs2s.atomic import atomic_write_bytes

from .speed_table import SpeedTableError
from .workload import PAPER_ROWS


def plot_table(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, NullFormatter
    except ImportError as exc:
        raise SpeedTableError(f"--plot needs matplotlib ({exc}); pip install matplotlib") from None
    rows, setup, machine = result["rows"], result["setup"], result["machine"]
    beams = sorted({r["beam"] for r in rows})
    fig, axes = plt.subplots(1, len(beams), figsize=(6.5 * len(beams), 4.2), squeeze=False)
    for ax, beam in zip(axes[0], beams):
        ours = [r for r in rows if r["beam"] == beam]
        paper = [p for p in PAPER_ROWS if p[3] in (beam, None)] if setup.get("newstest") else []
        labels = [f"{r['label']} {r['decoder']} {r['dtype']}" for r in ours] + [p[0] for p in paper]
        secs = [r["seconds"] for r in ours] + [p[2] for p in paper]
        colors = ["tab:blue"] * len(ours) + ["tab:gray"] * len(paper)
        y = range(len(labels))
        ax.barh(y, secs, color=colors)
        ax.errorbar([r["seconds"] for r in ours], range(len(ours)), fmt="none", ecolor="black", capsize=3,
                    xerr=[[r["seconds"] - r["seconds_min"] for r in ours], [r["seconds_max"] - r["seconds"] for r in ours]])
        ax.set_yticks(list(y), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlim(min(secs) / 2, max(secs) * 2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"seconds for {setup['sentences']:,} sentences"
                      + (" (estimated)" if setup["mode"] == "estimate" else ""))
        ax.set_title(f"beam {beam}")
        for yi, s in zip(y, secs):
            ax.text(s, yi, f" {s:,.0f}", va="center", fontsize=7)
    fig.suptitle(f"{setup['arch']} on {machine['cpu']}, {machine['threads']} threads (blue) "
                 "vs the paper's Table 3 (gray)", fontsize=9)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
