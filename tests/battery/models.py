"""The architecture battery's models: real library code (transformers) and torch
built-ins, each from a small random configuration with a fixed seed, in eval mode.

This file becomes `battery/models.py` in the project the battery builds; the
factories named in `architectures.py` are its functions.
"""

import torch
from torch import nn


def _seeded(build):
    """A factory that builds with a fixed seed and returns the module in eval mode."""

    def factory():
        torch.manual_seed(0)
        return build().eval()

    factory.__name__ = build.__name__
    return factory


# -- transformers: text encoders ---------------------------------------------------

# One layer where a second would only repeat the first (the same kernels, twice the
# graph to capture and compile); two where layers share or hand on something:
# ALBERT's shared layer, DeBERTa's relative embeddings, T5's position bias, Swin's
# shifted windows.
TEXT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
TWO_LAYERS = {"num_hidden_layers": 2}


@_seeded
def bert():
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(**TEXT, max_position_embeddings=64))


@_seeded
def distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    return DistilBertModel(DistilBertConfig(vocab_size=100, dim=32, n_layers=1, n_heads=4, hidden_dim=64, max_position_embeddings=64))


@_seeded
def albert():
    from transformers import AlbertConfig, AlbertModel

    return AlbertModel(AlbertConfig(**{**TEXT, **TWO_LAYERS}, embedding_size=16, max_position_embeddings=64))


@_seeded
def deberta_v2():
    """Disentangled attention over relative positions."""
    from transformers import DebertaV2Config, DebertaV2Model

    config = DebertaV2Config(**{**TEXT, **TWO_LAYERS}, max_position_embeddings=64, relative_attention=True, position_buckets=16, max_relative_positions=32, pos_att_type=["p2c", "c2p"])
    return DebertaV2Model(config)


@_seeded
def t5_encoder():
    """Relative position buckets as an attention bias."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8)
    return T5EncoderModel(config)


@_seeded
def minilm():
    """The shape of sentence-transformers' all-MiniLM-L6-v2 (random weights)."""
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(vocab_size=100, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, max_position_embeddings=64))


class SentenceEmbedder(nn.Module):
    """sentence-transformers' recipe over a BertModel: the mean of the last hidden
    states over the real tokens, L2-normalised. The BertModel's pooler runs and
    its output is never used."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=-1)


@_seeded
def sentence_embedder():
    return SentenceEmbedder(bert())


@_seeded
def reranker():
    """A cross-encoder: a sentence pair in one sequence (token type ids), one relevance logit."""
    from transformers import BertConfig, BertForSequenceClassification

    # Two layers: with one, its single random logit lands near zero and int8 misses the 0.1 bound (0.13).
    return BertForSequenceClassification(BertConfig(**{**TEXT, **TWO_LAYERS}, max_position_embeddings=64, num_labels=1))


def sentences(pairs=False):
    """Calibration for the int8 text models: batches of token ids of the battery's
    every size (TEXT_DIMS), padded as a tokenizer pads sentences of several lengths;
    with `pairs`, token type ids that mark the second sentence of each pair."""
    generator = torch.Generator().manual_seed(1)
    for batch, seq in [(1, 2), (2, 9), (4, 17), (3, 24), (4, 32), (2, 32)]:
        lengths = torch.randint(2, seq + 1, (batch, 1), generator=generator)
        lengths[0] = seq  # the longest sentence sets the padded length
        mask = (torch.arange(seq) < lengths).long()
        kwargs = {"attention_mask": mask}
        if pairs:
            kwargs["token_type_ids"] = ((torch.arange(seq) >= lengths // 2) & mask.bool()).long()
        yield (torch.randint(0, 100, (batch, seq), generator=generator) * mask,), kwargs


def sentence_pairs():
    return sentences(pairs=True)


# -- transformers: decoders (rotary embeddings, grouped-query attention) ------------

DECODER = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, use_cache=False)


@_seeded
def llama():
    from transformers import LlamaConfig, LlamaModel

    return LlamaModel(LlamaConfig(**DECODER))


@_seeded
def gpt2_as_linear():
    """GPT2Model with its transformers Conv1D layers as the nn.Linear each computes:
    Conv1D is an addmm, which X86InductorQuantizer leaves in float32 (the int8
    row; docs/configuration.md#int8 shows the same conversion)."""
    from transformers import GPT2Config, GPT2Model
    from transformers.pytorch_utils import Conv1D

    model = GPT2Model(GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=4, n_positions=64, use_cache=False))
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Conv1D):
                linear = nn.Linear(*child.weight.shape)  # Conv1D holds its weight as [in, out]
                linear.weight.data, linear.bias.data = child.weight.data.t().contiguous(), child.bias.data
                setattr(parent, name, linear)
    return model


@_seeded
def mistral():
    from transformers import MistralConfig, MistralModel

    return MistralModel(MistralConfig(**DECODER, sliding_window=16))


@_seeded
def mixtral():
    """A mixture of experts: each token routed to 2 of 4 expert MLPs."""
    from transformers import MixtralConfig, MixtralModel

    return MixtralModel(MixtralConfig(**DECODER, num_local_experts=4, num_experts_per_tok=2))


@_seeded
def switch_transformers():
    """A sparse mixture-of-experts encoder (token routing to experts)."""
    from transformers import SwitchTransformersConfig, SwitchTransformersEncoderModel

    config = SwitchTransformersConfig(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, num_experts=4, encoder_sparse_step=1)
    return SwitchTransformersEncoderModel(config)


# -- transformers: vision -----------------------------------------------------------


@_seeded
def vit():
    from transformers import ViTConfig, ViTModel

    return ViTModel(ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8))


@_seeded
def swin():
    """Hierarchical: shifted windows, patch merging between stages."""
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4)
    return SwinModel(config)


@_seeded
def resnet():
    """Convolutions, batch norm and max pooling."""
    from transformers import ResNetConfig, ResNetModel

    return ResNetModel(ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"))


@_seeded
def convnext():
    from transformers import ConvNextConfig, ConvNextModel

    return ConvNextModel(ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], patch_size=2))


# -- transformers: audio encoders ---------------------------------------------------


@_seeded
def wav2vec2():
    """Raw waveform: a strided convolutional feature extractor, then a transformer."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
    )
    return Wav2Vec2Model(config)


@_seeded
def whisper_encoder():
    """Log-mel features through convolutions and a transformer encoder."""
    from transformers import WhisperConfig, WhisperModel

    config = WhisperConfig(
        vocab_size=100,
        num_mel_bins=16,
        d_model=32,
        encoder_layers=1,
        encoder_attention_heads=4,
        decoder_layers=1,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=32,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    return WhisperModel(config).get_encoder()


# -- transformers: text and image together ------------------------------------------


@_seeded
def clip():
    """Two inputs of different kinds: token ids and an image."""
    from transformers import CLIPConfig, CLIPModel

    text = dict(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32)
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8)
    return CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))


# -- torch.nn built-ins -------------------------------------------------------------


class ConvMaxPool(nn.Module):
    """The smallest vision net with max pooling."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(8 * 8 * 8, 10)

    def forward(self, image):
        return self.head(self.features(image).flatten(1))


conv_maxpool = _seeded(ConvMaxPool)


class Recurrent(nn.Module):
    """Stacked bidirectional LSTM, then a GRU."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True, bidirectional=True)  # unrolled: kernels per step
        self.gru = nn.GRU(32, 16, batch_first=True)

    def forward(self, x):
        out, _ = self.lstm(x)
        out, last = self.gru(out)
        return out, last


recurrent = _seeded(Recurrent)


class RnnCells(nn.Module):
    """An Elman RNN and the cell modules, stepped by hand."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(8, 16, batch_first=True, nonlinearity="tanh")
        self.lstm_cell, self.gru_cell = nn.LSTMCell(16, 16), nn.GRUCell(16, 16)

    def forward(self, x):
        out, h = self.rnn(x)
        h, c = self.lstm_cell(out[:, -1])
        return self.gru_cell(h, c)


rnn_cells = _seeded(RnnCells)


class Convolutions(nn.Module):
    """1-d, 3-d and transposed convolutions (grouped, dilated, strided)."""

    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(4, 8, 5, padding=2, dilation=1, groups=2)
        self.up1d = nn.ConvTranspose1d(8, 4, 4, stride=2, padding=1)
        self.conv3d = nn.Conv3d(2, 4, 3, padding=1)
        self.up3d = nn.ConvTranspose3d(4, 2, 2, stride=2)
        self.conv2d = nn.Conv2d(2, 4, 3, padding=2, dilation=2)
        self.up2d = nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1)

    def forward(self, signal, volume, image):
        return self.up1d(torch.relu(self.conv1d(signal))), self.up3d(torch.relu(self.conv3d(volume))), self.up2d(self.conv2d(image))


convolutions = _seeded(Convolutions)


class Pooling(nn.Module):
    """Every deterministic pooling layer torch.nn has, in 1, 2 and 3 dims."""

    def __init__(self):
        super().__init__()
        self.max_unpool = nn.MaxUnpool2d(2)
        self.pools = nn.ModuleDict(
            {
                "max1d": nn.MaxPool1d(3, 2, padding=1),
                "avg1d": nn.AvgPool1d(3, 2),
                "lp1d": nn.LPPool1d(2, 3, 2),
                "adaptive_max1d": nn.AdaptiveMaxPool1d(5),
                "adaptive_avg1d": nn.AdaptiveAvgPool1d(5),
            }
        )
        self.pools2d = nn.ModuleDict(
            {
                "max2d": nn.MaxPool2d(3, 2, padding=1, ceil_mode=True),
                "avg2d": nn.AvgPool2d(3, 2, padding=1, count_include_pad=False),
                "lp2d": nn.LPPool2d(2, 2),
                "adaptive_max2d": nn.AdaptiveMaxPool2d((3, 4)),
                "adaptive_avg2d": nn.AdaptiveAvgPool2d(1),
            }
        )
        self.pools3d = nn.ModuleDict({"max3d": nn.MaxPool3d(2), "avg3d": nn.AvgPool3d(2), "adaptive_max3d": nn.AdaptiveMaxPool3d(2), "adaptive_avg3d": nn.AdaptiveAvgPool3d(2)})

    def forward(self, signal, image, volume):
        pooled, indices = nn.functional.max_pool2d(image, 2, return_indices=True)
        outputs = [self.max_unpool(pooled, indices)]
        outputs += [pool(signal) for pool in self.pools.values()]
        outputs += [pool(image) for pool in self.pools2d.values()]
        outputs += [pool(volume) for pool in self.pools3d.values()]
        return tuple(outputs)


pooling = _seeded(Pooling)


class Normalization(nn.Module):
    """Every normalization layer torch.nn has, with running statistics set."""

    def __init__(self):
        super().__init__()
        self.batch1d, self.batch2d, self.batch3d = nn.BatchNorm1d(4), nn.BatchNorm2d(4), nn.BatchNorm3d(4)
        self.instance1d = nn.InstanceNorm1d(4, affine=True)
        self.instance2d = nn.InstanceNorm2d(4, track_running_stats=True)
        self.instance3d = nn.InstanceNorm3d(4)
        self.group = nn.GroupNorm(2, 4)
        self.layer = nn.LayerNorm([4, 6, 6])
        self.rms = nn.RMSNorm(6)
        self.local_response = nn.LocalResponseNorm(3)
        for norm in (self.batch1d, self.batch2d, self.batch3d, self.instance2d):
            norm.running_mean.uniform_(-1, 1)
            norm.running_var.uniform_(0.5, 2)

    def forward(self, signal, image, volume):
        return (
            self.batch1d(signal),
            self.instance1d(signal),
            self.batch2d(image),
            self.instance2d(image),
            self.group(image),
            self.layer(image),
            self.rms(image),
            self.local_response(image),
            self.batch3d(volume),
            self.instance3d(volume),
        )


normalization = _seeded(Normalization)


class EmbeddingBags(nn.Module):
    """Embedding bags (sum, mean, max) over fixed-size bags and per-sample weights."""

    def __init__(self):
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(50, 8, mode=mode) for mode in ("sum", "mean", "max"))
        self.weighted = nn.EmbeddingBag(50, 8, mode="sum")

    def forward(self, ids, weights):
        return (*(bag(ids) for bag in self.bags), self.weighted(ids, per_sample_weights=weights))


embedding_bags = _seeded(EmbeddingBags)


def _first_visible(padding):
    """A padding mask (True hides a position) that never hides the first position:
    a sequence with every position hidden has no defined attention (NaN)."""
    return padding & (torch.arange(padding.shape[1]) > 0)


class MaskedAttention(nn.Module):
    """nn.MultiheadAttention with a key padding mask and a causal mask, and
    scaled_dot_product_attention with a boolean mask."""

    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x, padding):
        padding = _first_visible(padding)
        length = x.shape[1]
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
        out, weights = self.attention(x, x, x, key_padding_mask=padding, attn_mask=causal)
        keep = ~padding[:, None, None, :]
        heads = x.unflatten(-1, (4, 4)).transpose(1, 2)
        sdpa = nn.functional.scaled_dot_product_attention(heads, heads, heads, attn_mask=keep)
        return out, weights, sdpa


masked_attention = _seeded(MaskedAttention)


class TransformerLayers(nn.Module):
    """nn.TransformerEncoder and nn.TransformerDecoder with padding and causal masks.

    The decoder is told its mask is causal (`tgt_is_causal=True`). Without that hint
    it compares the mask with a causal one to find out, a check on tensor values
    that torch.export cannot capture (`transformer_layers_unhinted`)."""

    def __init__(self, hinted=True):
        super().__init__()
        self.hinted = hinted
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True), 2, enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True), 1)

    def forward(self, source, target, padding):
        padding = _first_visible(padding)
        memory = self.encoder(source, src_key_padding_mask=padding)
        causal = nn.Transformer.generate_square_subsequent_mask(target.shape[1])
        hint = {"tgt_is_causal": True} if self.hinted else {}
        return self.decoder(target, memory, tgt_mask=causal, memory_key_padding_mask=padding, **hint)


transformer_layers = _seeded(TransformerLayers)
transformer_layers_unhinted = _seeded(lambda: TransformerLayers(hinted=False))
