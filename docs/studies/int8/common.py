"""Models and inputs shared by produce.py and load.py (deterministic)."""

import torch


class MLP(torch.nn.Module):
    def __init__(self, width=1024, depth=6):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


class Bert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(
            vocab_size=30522,
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=1024,
            max_position_embeddings=512,
        )
        self.bert = BertModel(config, add_pooling_layer=False).eval()

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def make(name):
    torch.manual_seed(0)
    if name == "mlp":
        model = MLP().eval()
        example = (torch.randn(64, 1024),)
        calib = [(torch.randn(64, 1024),) for _ in range(8)]
        test = (torch.randn(64, 1024, generator=torch.Generator().manual_seed(123)),)
    elif name == "bert":
        model = Bert().eval()
        g = torch.Generator().manual_seed(1)

        def batch(gen):
            ids = torch.randint(0, 30522, (8, 128), generator=gen)
            mask = torch.ones(8, 128, dtype=torch.long)
            mask[4:, 100:] = 0  # some padding
            return (ids, mask)

        example = batch(g)
        calib = [batch(g) for _ in range(8)]
        test = batch(torch.Generator().manual_seed(123))
    else:
        raise ValueError(name)
    return model, example, calib, test
