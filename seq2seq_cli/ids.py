"""The special token ids every vocabulary of this tool shares (SentencePiece is trained with them)."""

PAD, UNK, BOS, EOS = 0, 1, 2, 3
