import torch

from seq2seq_cli.model.masks import causal_mask, decoder_self_mask, padding_mask


def test_padding_mask_literal():
    ids = torch.tensor([[5, 6, 7], [5, 0, 0]])
    expected = torch.tensor([[True, True, True], [True, False, False]])
    m = padding_mask(ids, pad_id=0)
    assert m.shape == (2, 1, 1, 3)
    assert torch.equal(m[:, 0, 0], expected)


def test_causal_mask_literal():
    expected = torch.tensor(
        [
            [True, False, False, False],
            [True, True, False, False],
            [True, True, True, False],
            [True, True, True, True],
        ]
    )
    m = causal_mask(4)
    assert m.shape == (1, 1, 4, 4)
    assert torch.equal(m[0, 0], expected)


def test_decoder_mask_is_padding_and_causal_literal():
    ids = torch.tensor([[2, 9, 0]])  # BOS, a token, pad
    expected = torch.tensor(
        [
            [True, False, False],
            [True, True, False],
            [True, True, False],  # the pad key is never visible, even to later queries
        ]
    )
    m = decoder_self_mask(ids, pad_id=0)
    assert m.shape == (1, 1, 3, 3)
    assert torch.equal(m[0, 0], expected)
