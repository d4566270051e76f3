"""The special token ids every vocabulary of this tool shares (SentencePiece is trained with them)."""

PAD, UNK, BOS, EOS = 0, 1, 2, 3

RESERVED_PIECES = {"<pad>": (PAD, "padding"), "<unk>": (UNK, "unknown"), "<s>": (BOS, "start-of-sentence"),
                   "</s>": (EOS, "end-of-sentence")}
"""The pieces of those ids, as SentencePiece names them: no text may become one of them."""
