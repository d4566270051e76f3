"""End-to-end learning check: a small model learns to reverse digit strings exactly."""

import torch

from seq2seq_cli.config import DecodeConfig, ModelConfig
from seq2seq_cli.data.batching import pad_batch
from seq2seq_cli.decode.search import beam_search, greedy_search
from seq2seq_cli.ids import BOS, EOS
from seq2seq_cli.model.transformer import build_model
from seq2seq_cli.train.loss import label_smoothed_nll
from seq2seq_cli.train.schedule import inverse_sqrt_lr

SYMBOLS = list(range(4, 14))


def _examples(n, g):
    seqs = []
    for _ in range(n):
        length = int(torch.randint(3, 8, (1,), generator=g))
        seqs.append([SYMBOLS[int(i)] for i in torch.randint(0, len(SYMBOLS), (length,), generator=g)])
    return seqs


def test_reverse_task_is_learned_to_exact_match():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    cfg = ModelConfig(d_model=64, heads=4, ffn_size=128, encoder_layers=2, decoder_layers=2, dropout=0.0, max_positions=32)
    model = build_model(cfg, 14, 14, joint_vocab=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    for step in range(1, 401):
        seqs = _examples(64, g)
        rev = [s[::-1] for s in seqs]
        src, tgt_in, tgt_out = pad_batch(seqs, [], [EOS]), pad_batch(rev, [BOS], []), pad_batch(rev, [], [EOS])
        for group in opt.param_groups:
            group["lr"] = inverse_sqrt_lr(step, 3e-3, 50, 1e-7)
        loss, _, n = label_smoothed_nll(model(src, tgt_in), tgt_out, 0.0)
        opt.zero_grad()
        (loss / n).backward()
        opt.step()
    model.eval()
    test = _examples(100, torch.Generator().manual_seed(123))
    src = pad_batch(test, [], [EOS])
    greedy = [h.tokens for h in greedy_search(model, src, DecodeConfig(beam_size=1, max_len_a=1.0, max_len_b=2))]
    beam = [n[0].tokens for n in beam_search(model, src, DecodeConfig(beam_size=4, max_len_a=1.0, max_len_b=2))]
    expected = [s[::-1] for s in test]
    assert greedy == expected
    assert beam == expected
