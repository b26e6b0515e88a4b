"""``bench/tools/train_products.py``: an update's products, inside it and timed alone, and the ceiling they set."""

import json
import os

from convs2s.dictionary import Dictionary

from harness import bench_script, require_or_skip
from test_train import make_copy_data


def test_products_are_found_timed_and_bound_the_update(tmp_path, capsys):
    require_or_skip("cpp")
    data = make_copy_data(tmp_path / "bin", 200)
    out = tmp_path / "products.json"
    assert bench_script("train_products").main([data, "--max-tokens", "300", "--updates", "2", "--warmup", "1",
                                                "--top", "3", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["products"]
    assert rows and all(r["gflop"] > 0 and r["calls"] >= 1 and r["seconds"] > 0 for r in rows)
    # every output-layer product is there: fc3's logits, dx and dW, each update (the only shapes with V)
    vocab = len(Dictionary.load(os.path.join(data, "dict.tgt.txt")))
    assert vocab == 16 and sum(r["calls"] for r in rows if any(vocab in s for s in r["shapes"] if s)) >= 3 * 2
    assert abs(result["products_s"] - sum(r["seconds"] for r in rows)) < 1e-9
    # the products alone take part of the updates, never all of them
    assert 0 < result["products_alone_s"] < result["unprofiled_s"]
    text = capsys.readouterr().out
    assert "with nothing else, updates" in text and "GEMM peak" in text
