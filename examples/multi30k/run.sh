#!/usr/bin/env bash
# Multi30k (task 1) En->De (or De->En) with the paper's recipe on a CPU, then BLEU on test_2016_flickr.
#
#   bash examples/multi30k/run.sh [WORK_DIR]
#
# MULTI30K points at a folder with {train,val,test_2016_flickr}.{en,de}.gz; by default the
# project's ../shared copy, else the files are fetched with `convs2s data multi30k`.
# TRAIN_MINUTES (default 90) bounds the training time, the last DECAY_MINUTES (default 25) annealing
# the lr to zero; snapshots are kept at 30 and 60 minutes.
# SRC / TGT (default en / de) pick the direction, e.g. SRC=de TGT=en; DROPOUT (default 0.4) is for
# trying another on the validation set.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:-runs/multi30k}"
minutes="${TRAIN_MINUTES:-90}"
decay="${DECAY_MINUTES:-25}"
src="${SRC:-en}"
tgt="${TGT:-de}"
dropout="${DROPOUT:-0.4}"
data="${MULTI30K:-$here/../../../shared/data/multi30k}"
if [ ! -f "$data/train.en.gz" ]; then
    data="$work/raw"
    python3 -m convs2s data multi30k --out "$data" --langs en,de
fi
mkdir -p "$work"
# a work folder holds one direction: its data and checkpoints are reused (--resume), so never another's
if [ -f "$work/bin/meta.json" ]; then
    made=$(python3 -c "import json, sys; m = json.load(open(sys.argv[1])); print(m['src_lang'] + '-' + m['tgt_lang'])" \
        "$work/bin/meta.json")
    if [ "$made" != "$src-$tgt" ]; then
        echo "error: $work holds a $made run, not $src-$tgt; give another WORK_DIR" >&2
        exit 2
    fi
fi

# Joint 8K sentencepiece BPE; Multi30k is clean, so no length-ratio filter (--max-ratio 0).
[ -f "$work/bin/meta.json" ] || python3 -m convs2s data prepare --train "$data/train" --valid "$data/val" \
    -s "$src" -t "$tgt" --out "$work/bin" --bpe-size 8000 --max-ratio 0

# fairseq's IWSLT fconv recipe (NAG lr 0.25 momentum 0.99, clip 0.1, label smoothing 0.1, its fixed
# lr: --lr-shrink 1, chosen over the paper's lr / 10 on every validation plateau) with dropout 0.4 for
# its 0.2 (Multi30k is a fifth of IWSLT's size; 0.3, then 0.4, each chosen on the validation set,
# bench/results/multi30k-recipe-history.md) with 1000-token batches: four times the updates
# per epoch, since 90 minutes on 2 cores end the run long before it converges; the last 25 minutes
# take the lr linearly to zero, so the clock stops an annealed model.
# bf16 autocast where a conv+GLU layer's forward+backward was measured faster than fp32 (--precision auto).
python3 -m convs2s train "$work/bin" --save-dir "$work/ckpt" --arch fconv_iwslt_de_en \
    --dropout "$dropout" --label-smoothing 0.1 --lr 0.25 --clip-norm 0.1 --max-tokens 1000 --lr-shrink 1 --precision auto \
    --max-time "$minutes" --decay-minutes "$decay" --snapshot-minutes 30,60 --keep-last-epochs 5 --resume

# fairseq's checkpoint averaging over the last 5 epochs (those of the annealing)
epochs=$(ls "$work/ckpt" | grep -c '^checkpoint[0-9]*\.pt$' || true)
if [ "$epochs" -ge 5 ]; then
    python3 -m convs2s average-checkpoints --folder "$work/ckpt" --num-epoch-checkpoints 5 \
        --output "$work/ckpt/checkpoint_avg5.pt"
else
    echo "no average: $epochs epoch checkpoints, fewer than 5"
fi

for ckpt in checkpoint_30min checkpoint_60min checkpoint_last checkpoint_best checkpoint_avg5; do
    [ -f "$work/ckpt/$ckpt.pt" ] || continue
    for test in test_2016_flickr test_2017_flickr; do
        [ -f "$data/$test.$src.gz" ] || continue
        python3 -m convs2s generate --fairseq-checkpoint "$work/ckpt/$ckpt.pt" --spm "$work/ckpt/spm.model" \
            --input "$data/$test.$src.gz" --reference "$data/$test.$tgt.gz" \
            --beam 5 --batch-size 128 > "$work/$ckpt.$test.out"
        echo "$ckpt $test: $(tail -n 1 "$work/$ckpt.$test.out")"
    done
done
