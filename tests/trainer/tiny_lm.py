"""A tiny but real language model honouring the models contract, for trainer tests that must
not depend on the full GPT: embedding -> tanh MLP -> output head, token cross-entropy.

``forward(input_ids, labels, loss_mask) -> (loss_sum, n_tokens, aux_loss)`` with
``aux_loss = aux_coeff * mean(hidden^2)`` so the auxiliary-loss path is exercised too.
"""
import numpy as np
import mindspore as ms
from mindspore import nn, ops, Parameter, Tensor


class TinyLM(nn.Cell):
    def __init__(self, vocab=16, hidden=8, seed=0, aux_coeff=0.0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.embedding = Parameter(Tensor(rng.normal(0, 0.5, (vocab, hidden)).astype(np.float32)),
                                   name="embedding.word_embeddings.weight")
        self.fc = Parameter(Tensor(rng.normal(0, 0.5, (hidden, hidden)).astype(np.float32)),
                            name="decoder.mlp.linear_fc1.weight")
        self.bias = Parameter(Tensor(np.zeros(hidden, np.float32)), name="decoder.mlp.linear_fc1.bias")
        self.head = Parameter(Tensor(rng.normal(0, 0.5, (hidden, vocab)).astype(np.float32)),
                              name="output_layer.weight")
        self.vocab = vocab
        self.aux_coeff = aux_coeff

    def construct(self, input_ids, labels, loss_mask):
        h = ops.gather(self.embedding, input_ids, 0)                  # [B, S, H]
        h = ops.tanh(ops.matmul(h, self.fc) + self.bias)
        logits = ops.matmul(h, self.head)                              # [B, S, V]
        logp = ops.log_softmax(logits, -1)
        onehot = ops.one_hot(labels, self.vocab, Tensor(1.0, ms.float32), Tensor(0.0, ms.float32))
        nll = -(logp * onehot).sum(-1)                                 # [B, S]
        loss_sum = (nll * loss_mask).sum()
        n_tokens = loss_mask.sum()
        aux = self.aux_coeff * (h * h).mean()
        return loss_sum, n_tokens, aux
