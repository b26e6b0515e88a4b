"""fairseq's four special symbols and their ids: the one place convs2s defines them.

Every fairseq dictionary starts with ``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3 (in that
order, before the first real word); sources end in EOS and are left-padded with PAD, decoder
inputs start with EOS.
"""

from __future__ import annotations

BOS, PAD, EOS, UNK = 0, 1, 2, 3
BOS_SYMBOL, PAD_SYMBOL, EOS_SYMBOL, UNK_SYMBOL = "<s>", "<pad>", "</s>", "<unk>"
SYMBOLS = (BOS_SYMBOL, PAD_SYMBOL, EOS_SYMBOL, UNK_SYMBOL)  # index = id
NUM_SPECIALS = len(SYMBOLS)  # the first real word's id
