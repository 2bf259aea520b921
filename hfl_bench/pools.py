"""Architecture pools: lists of timm model names assigned round-robin to clients.

Our own small models are registered into timm's model registry, so every pool member is built
by ``timm.create_model``. Members adapt to the task: input channels (``in_chans``), classes
(``num_classes``) and input size (``img_size``, used by the models that need it).

timm is imported lazily (it takes seconds): importing this module registers the pools but not
timm. Our models enter timm's registry the moment timm is imported, by whoever imports it
(``build_model``, ``timm_module()``, or any ``import timm`` after this module's): a one-shot
import hook runs ``_register_timm_models`` right after timm's own import.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hfl_bench.capacity import LEVELS, RATE_LEVEL, assign_rates, parse_profile
from hfl_bench.data import TaskInfo, modality_layout
from hfl_bench.modelhead import (
    TimmHead,  # noqa: F401  (re-exported: our models and plugins' build on it)
    conv_stack,
)
from hfl_bench.registry import POOLS

if TYPE_CHECKING:
    from timm.models.resnet import ResNet

# Arguments timm.create_model passes that our constructors have no use for.
_TIMM_ONLY_KWARGS = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir", "features_only")


def _clean(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k not in _TIMM_ONLY_KWARGS}


def _conv_bn_relu(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class PlainCNN(TimmHead, nn.Module):
    """Conv-BN-ReLU stack without residuals, 2x2 max-pool after the listed layers, GAP, linear."""

    def __init__(self, channels, pool_after, num_classes, in_chans, img_size):
        super().__init__()
        self.features, self.num_features = conv_stack(in_chans, channels, img_size, _conv_bn_relu, pool_after)
        self.fc = nn.Linear(self.num_features, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def pool_features(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


class MLP(TimmHead, nn.Module):
    def __init__(self, hidden, num_classes, in_chans, img_size):
        super().__init__()
        dims = [in_chans * img_size[0] * img_size[1], *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        layers.append(nn.Linear(dims[-1], num_classes))
        self.net = nn.Sequential(*layers)
        self.num_features = dims[-1]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[:-1](x)

    def get_classifier(self) -> nn.Module:
        return self.net[-1]

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.net[-1] = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()


def _small_input_resnet(channels, layers, num_classes, in_chans, **kwargs) -> "ResNet":
    """timm's ResNet with a CIFAR-style stem: 3x3 stride-1 conv and no max-pool.

    The stem keeps timm's 64 channels: its first stage expects them.
    """
    from timm.models.resnet import BasicBlock, ResNet

    model = ResNet(
        BasicBlock, layers=layers, channels=channels, num_classes=num_classes,
        in_chans=in_chans, **kwargs,
    )
    model.conv1 = nn.Conv2d(in_chans, model.conv1.out_channels, 3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def resnet18_cifar(pretrained=False, num_classes=10, in_chans=3, img_size=None, **kwargs):
    """ResNet-18 (timm) with a CIFAR-style stem for small inputs: ~11.2M parameters."""
    return _small_input_resnet((64, 128, 256, 512), (2, 2, 2, 2), num_classes, in_chans, **_clean(kwargs))


def resnet18_half_cifar(pretrained=False, num_classes=10, in_chans=3, img_size=None, **kwargs):
    """ResNet-18 at half channel width (stem stays 64, as timm's BN requires): ~2.8M parameters."""
    return _small_input_resnet((32, 64, 128, 256), (2, 2, 2, 2), num_classes, in_chans, **_clean(kwargs))


def cnn6(pretrained=False, num_classes=10, in_chans=3, img_size=(32, 32), **kwargs):
    """CNN-6: five 3x3 conv-BN-ReLU layers and a linear head, no residuals (~0.76M parameters).

    Reconstructed: the CRAD paper gives only the name, "no residuals" and ~0.8M parameters.
    """
    return PlainCNN((32, 64, 128, 192, 256), {1, 2, 3}, num_classes, in_chans, img_size)


def mlp_small(pretrained=False, num_classes=10, in_chans=1, img_size=(8, 8), **kwargs):
    """Two hidden layers (256, 128) on the flattened input: a CPU-sized non-convolutional member."""
    return MLP((256, 128), num_classes, in_chans, img_size)


def cnn_small(pretrained=False, num_classes=10, in_chans=1, img_size=(8, 8), **kwargs):
    """Three conv-BN-ReLU layers (16, 32, 64 channels), max-pool after the first two, GAP."""
    return PlainCNN((16, 32, 64), {0, 1}, num_classes, in_chans, img_size)


class TinyResNet(TimmHead, nn.Module):
    """A 16-channel 3x3 stem, then two stages of timm's ``BasicBlock`` (16 and 32 channels)."""

    def __init__(self, num_classes, in_chans, widths=(16, 32)):
        from timm.models.resnet import BasicBlock

        super().__init__()
        self.stem = nn.Sequential(*_conv_bn_relu(in_chans, widths[0]))
        blocks, cin = [], widths[0]
        for i, cout in enumerate(widths):
            stride = 1 if i == 0 else 2
            down = None
            if stride != 1 or cin != cout:
                down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
            blocks.append(BasicBlock(cin, cout, stride=stride, downsample=down))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.num_features = cin
        self.fc = nn.Linear(cin, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x))

    def pool_features(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def resnet_tiny(pretrained=False, num_classes=10, in_chans=1, img_size=None, **kwargs):
    """A tiny residual network from timm's BasicBlock: 16-channel stem, stages of 16 and 32."""
    return TinyResNet(num_classes, in_chans)


class LateFusionNet(TimmHead, nn.Module):
    """Multimodal late fusion: one encoder per observed modality (any timm model, its classifier
    sized to ``dim``), the mean of the encodings of the modalities a sample has, ReLU, a linear head.

    A modality is read only for the rows where all its values are finite: a missing modality is
    NaN (hfl_bench.modalities), so a recipient's rows never reach the encoder of what it lacks,
    and a donor's model used as a teacher on a recipient's rows fuses the modalities the
    recipient has. ``modalities`` names the encoders this model has (a recipient's model has only
    the ones it observes); a row with none of them gives NaN logits, never a silent guess.
    """

    def __init__(self, encoders: dict[str, nn.Module], layout: dict[str, tuple[slice, tuple[int, ...]]],
                 dim: int, num_classes: int):
        super().__init__()
        self.encoders = nn.ModuleDict(encoders)
        self.layout = {name: layout[name] for name in encoders}
        self.modalities = tuple(encoders)
        self.dim = self.num_features = dim
        self.head = nn.Linear(dim, num_classes)

    classifier_attr = "head"

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The fused encoding (ReLU of the mean over the modalities a row has), ``[B, dim]``."""
        flat = x.reshape(len(x), -1)
        total = flat.new_zeros(len(x), self.dim)
        count = flat.new_zeros(len(x), 1)
        for name, encoder in self.encoders.items():
            where, shape = self.layout[name]
            part = flat[:, where]
            present = torch.isfinite(part).all(dim=1)
            if bool(present.all()):
                total = total + encoder(part.reshape(-1, *shape))
                count = count + 1
            elif bool(present.any()):
                rows = present.nonzero().squeeze(1)
                total = total.index_add(0, rows, encoder(part[rows].reshape(-1, *shape)))
                count = count + present.unsqueeze(1).to(count.dtype)
        return torch.relu(total / count)  # 0/0 = NaN for a row with none of our modalities


def late_fusion(pretrained=False, num_classes=10, in_chans=1, img_size=None, encoders=(), dim=64,
                task_modalities=(), observed=None, **kwargs):
    """Late fusion of per-modality timm encoders (``encoders``: (modality, timm model name) pairs)
    for a multimodal task; ``observed`` limits it to those modalities (a recipient's model)."""
    from hfl_bench.config import ConfigError

    if not task_modalities:
        raise ConfigError("late_fusion models are for multimodal tasks (hfl-bench list tasks shows their "
                          "modalities); use a single-modality pool such as cpu")
    names = [m.name for m in task_modalities]
    chosen = dict(encoders)
    unknown = sorted(set(chosen) - set(names))
    if unknown or set(names) - set(chosen):
        raise ConfigError(f"late_fusion: encoders for {sorted(chosen)}, but the task's modalities are {names}")
    keep = [n for n in names if observed is None or n in observed]
    timm = timm_module()
    layout = modality_layout(task_modalities)
    built = {n: timm.create_model(chosen[n], pretrained=False, num_classes=dim, in_chans=layout[n][1][0],
                                  img_size=layout[n][1][1:]) for n in keep}
    return LateFusionNet(built, layout, dim, num_classes)


# --------------------------------------------------------------------------- text (token ids)
# The text pool's models read int64 token ids (a text task, ``TaskInfo.input_kind == "tokens"``):
# a sample [1, 1, L] of ids, 0 padding. Their embeddings have ``TEXT_VOCAB`` rows, the id bound a
# text task's vocabulary keeps (hfl_bench.text_corpus.VOCAB_SIZE).
TEXT_VOCAB = 10_002


class TextNet(TimmHead, nn.Module):
    """Base of the text models: token ids [B, ...] -> embeddings, an encoder of ``encode``, a
    linear head. Float inputs are refused: an id is not a value, and a float here means a method
    made inputs no vocabulary has (an input-space generator, noise)."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)

    def ids(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_floating_point():
            raise TypeError("text models read int64 token ids, not float inputs")
        return x.reshape(len(x), -1).long()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        ids = self.ids(x)
        return self.encode(self.embed(ids), ids != 0)


def _masked_mean(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1).clamp_min(1.0)


class BagOfEmbeddings(TextNet):
    """fastText-like: the mean of the words' embeddings, a linear head."""

    def __init__(self, num_classes, vocab_size=TEXT_VOCAB, dim=64):
        super().__init__(vocab_size, dim)
        self.num_features = dim
        self.fc = nn.Linear(dim, num_classes)

    def encode(self, e, mask):
        return _masked_mean(e, mask)


class TextCNN(TextNet):
    """Kim's TextCNN: 1-D convolutions of widths 3, 4, 5 over the embeddings, max over time."""

    def __init__(self, num_classes, vocab_size=TEXT_VOCAB, dim=64, filters=32, widths=(3, 4, 5)):
        super().__init__(vocab_size, dim)
        self.convs = nn.ModuleList(nn.Conv1d(dim, filters, w, padding=w // 2) for w in widths)
        self.num_features = filters * len(widths)
        self.fc = nn.Linear(self.num_features, num_classes)

    def encode(self, e, mask):
        h = e.transpose(1, 2)
        return torch.cat([torch.relu(conv(h)).amax(dim=2) for conv in self.convs], dim=1)


class BiGRU(TextNet):
    """A bidirectional GRU; the mean of its outputs over the words."""

    def __init__(self, num_classes, vocab_size=TEXT_VOCAB, dim=64, hidden=48):
        super().__init__(vocab_size, dim)
        self.gru = nn.GRU(dim, hidden, batch_first=True, bidirectional=True)
        self.num_features = 2 * hidden
        self.fc = nn.Linear(self.num_features, num_classes)

    def encode(self, e, mask):
        # Not cuDNN's fused GRU on a GPU: it has no double backward, which fedl2g takes (the native one does).
        with torch.backends.cudnn.flags(enabled=False):
            h, _ = self.gru(e)
        return _masked_mean(h, mask)


class TextTransformer(TextNet):
    """A small Transformer encoder (learned positions, pre-norm), the mean of its outputs."""

    def __init__(self, num_classes, vocab_size=TEXT_VOCAB, dim=64, layers=2, heads=4, max_len=512):
        super().__init__(vocab_size, dim)
        self.pos = nn.Parameter(torch.zeros(1, max_len, dim))
        nn.init.normal_(self.pos, std=0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.num_features = dim
        self.fc = nn.Linear(dim, num_classes)

    def encode(self, e, mask):
        mask = mask.clone()
        mask[:, 0] = True  # a row of padding only would attend to nothing (NaN): its first position counts
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):  # twice differentiable (fedl2g differentiates a gradient)
            h = self.encoder(e + self.pos[:, : e.shape[1]], src_key_padding_mask=~mask)
        return _masked_mean(h, mask)


def text_bag(pretrained=False, num_classes=2, in_chans=1, img_size=None, **kwargs):
    return BagOfEmbeddings(num_classes, **_clean(kwargs))


def text_cnn(pretrained=False, num_classes=2, in_chans=1, img_size=None, **kwargs):
    return TextCNN(num_classes, **_clean(kwargs))


def text_bigru(pretrained=False, num_classes=2, in_chans=1, img_size=None, **kwargs):
    return BiGRU(num_classes, **_clean(kwargs))


def text_transformer(pretrained=False, num_classes=2, in_chans=1, img_size=None, **kwargs):
    return TextTransformer(num_classes, **_clean(kwargs))


TEXT_MODELS = ("text_bag", "text_cnn", "text_bigru", "text_transformer")  # pool members that read token ids


# Registered into timm's model registry (by function name) when timm is imported.
_TIMM_MODELS = (resnet18_cifar, resnet18_half_cifar, cnn6, mlp_small, cnn_small, resnet_tiny, late_fusion,
                text_bag, text_cnn, text_bigru, text_transformer)
MULTIMODAL_MODELS = ("late_fusion",)  # pool members that build a model for a multimodal task
_registered = False
_register_lock = threading.RLock()


def _register_timm_models() -> None:
    """Register our models into timm's registry, once (timm warns when a name is registered twice)."""
    global _registered
    with _register_lock:
        if _registered:
            return
        from timm.models import register_model

        from hfl_bench.sensor_models import SENSOR_MODELS  # here: that module imports this one
        from hfl_bench.width_models import WIDTH_MODELS

        for fn in _TIMM_MODELS + SENSOR_MODELS + WIDTH_MODELS:
            register_model(fn)
        from hfl_bench.depth_models import DEPTH_MODELS

        for fn in DEPTH_MODELS:
            register_model(fn)
        _registered = True


def timm_module() -> ModuleType:
    """``timm``, imported now if it was not, with our models registered."""
    import timm

    _register_timm_models()
    return timm


class _RegisterOnTimmImport(importlib.abc.MetaPathFinder):
    """When ``timm`` is first imported (by anyone), register our models right after its module
    has run, so ``timm.is_model("cnn_small")`` holds wherever timm is used. Leaves
    ``sys.meta_path`` once timm has been imported."""

    def __init__(self):
        self._finding = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "timm" or getattr(self._finding, "on", False):
            return None
        self._finding.on = True
        try:
            spec = importlib.util.find_spec("timm")  # the other finders' answer
        finally:
            self._finding.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_timm = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            _remove_hook()
            exec_timm(module)
            _register_timm_models()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_HOOK = _RegisterOnTimmImport()


def _remove_hook() -> None:
    try:
        sys.meta_path.remove(_HOOK)
    except ValueError:
        pass


if "timm" in sys.modules:
    _register_timm_models()
else:
    sys.meta_path.insert(0, _HOOK)


@dataclass(frozen=True)
class PoolMember:
    model: str  # a timm model name
    kwargs: dict[str, Any] = field(default_factory=dict)
    label: str = ""  # display name; defaults to the model name

    @property
    def name(self) -> str:
        return self.label or self.model

    @property
    def multimodal(self) -> bool:
        return self.model in MULTIMODAL_MODELS

    @property
    def text(self) -> bool:
        """Whether the member reads token ids (a text task's inputs)."""
        return self.model in TEXT_MODELS

    def observing(self, observed: tuple[str, ...], all_modalities: tuple[str, ...]) -> "PoolMember":
        """This member built with encoders for ``observed`` only; named ``label[image]`` when that is
        not every modality (a recipient's architecture, reported apart from the donors')."""
        if tuple(observed) == tuple(all_modalities):
            return self
        return PoolMember(self.model, {**self.kwargs, "observed": tuple(observed)},
                          f"{self.name}[{'+'.join(observed)}]")


@dataclass(frozen=True)
class ArchPool:
    """An ordered list of architectures; client i gets ``members[i % len(members)]``."""

    name: str
    members: tuple[PoolMember, ...]
    description: str = ""
    # True for a pool of paper-scale models (ResNet-18s) that a protocol runs on a GPU: ``run`` on a
    # CPU says so before the first round and estimates the run's time after it.
    gpu_sized: bool = False
    # True for a levels pool: its members are one width-scalable model built at the capacity levels
    # a-e in order (``hfl_bench.capacity.LEVELS``), so a capacity profile can pick each client's member.
    capacity_levels: bool = False

    def assign(self, n_clients: int, profile: str | None = None, seed: int = 0) -> list[PoolMember]:
        """Each client's member: round-robin; or, with a capacity ``profile`` (a levels pool only),
        the member at the level the sub-model family draws for the client under that profile and
        ``seed`` (the run's capacity seed: ``training.derive_seed(run_seed, CAPACITY_STREAM)``)."""
        if profile is None:
            return [self.members[i % len(self.members)] for i in range(n_clients)]
        self.check_profile(profile)
        by_level = dict(zip(LEVELS, self.members))
        return [by_level[RATE_LEVEL[rate]] for rate in assign_rates(parse_profile(profile), n_clients, seed)]

    def check_profile(self, profile: str | None) -> None:
        """A capacity profile needs a levels pool (ConfigError, one line, otherwise)."""
        if profile is not None and not self.capacity_levels:
            from hfl_bench.config import ConfigError

            raise ConfigError(f"--capacity-profile picks each client's member of a levels pool; pool {self.name} "
                              f"is not one: use --pool heterofl-cnn-levels (the sub-model methods take their profile "
                              f"as --set profile=...)")

    @property
    def homogeneous(self) -> bool:
        return len({(m.model, tuple(sorted(m.kwargs.items()))) for m in self.members}) == 1


def build_model(member: PoolMember, info: TaskInfo) -> nn.Module:
    in_chans, *size = info.input_shape
    extra = {"task_modalities": info.modalities} if member.multimodal else {}
    return timm_module().create_model(
        member.model,
        pretrained=False,
        num_classes=info.num_classes,
        in_chans=in_chans,
        img_size=tuple(size),
        **extra,
        **member.kwargs,
    )


def check_pool_for_task(pool: "ArchPool", info: TaskInfo) -> None:
    """A multimodal task needs a pool of multimodal members, and a single-modality task one of
    single-modality members; a text task (token ids) a pool of text members, and any other task
    one without them (ConfigError naming a pool that fits)."""
    from hfl_bench.config import ConfigError

    tokens = info.input_kind == "tokens"
    text = [m.text for m in pool.members]
    if tokens and not all(text):
        raise ConfigError(f"pool {pool.name} does not build models that read token ids (task {info.name} is text); "
                          f"use a text pool such as text")
    if not tokens and any(text):
        raise ConfigError(f"pool {pool.name} builds text models (they read token ids); task {info.name} is not "
                          f"text: use a pool such as cpu")

    multimodal = [m.multimodal for m in pool.members]
    if info.modalities and not all(multimodal):
        raise ConfigError(f"pool {pool.name} does not build models for a task with several modalities "
                          f"({info.name}: {', '.join(m.name for m in info.modalities)}); use a multimodal pool "
                          f"such as cpu-mm")
    if not info.modalities and any(multimodal):
        raise ConfigError(f"pool {pool.name} builds multimodal models; task {info.name} has one modality: "
                          f"use a pool such as cpu")


def seeded_model(member: PoolMember, info: TaskInfo, seed: int, device: torch.device, *,
                 keep_global_rng: bool) -> nn.Module:
    """``build_model`` initialized from ``seed``, on ``device``, channels-last on CUDA (faster
    convolutions on tensor cores; indexing keeps the layout). ``keep_global_rng`` builds under a
    forked RNG so the run's global stream is left alone; the engine builds the clients' models
    without it (their seeds set the stream, as they always have)."""
    with torch.random.fork_rng(devices=[], enabled=keep_global_rng):
        torch.manual_seed(seed)
        model = build_model(member, info).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    return model


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def register_pool(pool: ArchPool) -> ArchPool:
    """Register ``pool`` under its name; its origin is the calling module (a plugin's pools are
    recorded as the plugin's, not hfl-bench's)."""
    caller = sys._getframe(1).f_globals.get("__name__", __name__)
    return POOLS.register(pool.name, pool, origin=caller)


def get_pool(name: str) -> ArchPool:
    return POOLS.get(name)


register_pool(ArchPool(
    "paper",
    (PoolMember("resnet18_cifar", label="resnet18"), PoolMember("resnet18_half_cifar", label="resnet18-half"),
     PoolMember("cnn6")),
    "CRAD paper pool (Sec. 4.1): ResNet-18, ResNet-18 at half width, CNN-6, round-robin.",
    gpu_sized=True,
))
register_pool(ArchPool(
    "cpu",
    (PoolMember("mlp_small"), PoolMember("cnn_small"), PoolMember("resnet_tiny")),
    "CPU-sized heterogeneous pool for the offline tasks: an MLP, a plain CNN and a tiny ResNet.",
))
register_pool(ArchPool(
    "cpu-mm",
    (PoolMember("late_fusion", {"encoders": (("image", "cnn_small"), ("signal", "mlp_small"))}, "fusion-cnn-mlp"),
     PoolMember("late_fusion", {"encoders": (("image", "mlp_small"), ("signal", "cnn_small"))}, "fusion-mlp-cnn"),
     PoolMember("late_fusion", {"encoders": (("image", "resnet_tiny"), ("signal", "cnn_small"))}, "fusion-resnet-cnn")),
    "Multimodal CPU pool for digits-mnist1d: per-modality encoders (image, signal) fused late (mean of "
    "64-d encodings, ReLU, linear head), heterogeneous across clients; a recipient's model has only the "
    "encoders of what it observes.",
))
register_pool(ArchPool(
    "cpu-cnn", (PoolMember("cnn_small"),), "Homogeneous CPU pool (every client a cnn_small), e.g. for fedavg."
))
register_pool(ArchPool(
    "sensor",
    (PoolMember("sensor_cnn1d", label="cnn1d"), PoolMember("sensor_gru", label="gru"),
     PoolMember("sensor_tcn", label="tcn"), PoolMember("sensor_transformer", label="transformer")),
    "CPU-sized heterogeneous pool for multichannel time series (hapt, uci-har), after HtFLlib's HAR pools: a 1-D "
    "CNN, a GRU over a strided convolution, a dilated causal TCN and a small Transformer encoder.",
))
register_pool(ArchPool(
    "sensor-cnn", (PoolMember("sensor_cnn1d", label="cnn1d"),),
    "Homogeneous sensor pool (every client the 1-D CNN of pool sensor), e.g. for fedavg on hapt or uci-har.",
))
register_pool(ArchPool(
    "paper-resnet18", (PoolMember("resnet18_cifar", label="resnet18"),),
    "Homogeneous paper-scale pool (every client a CIFAR-stem ResNet-18), e.g. for fedavg.",
    gpu_sized=True,
))
register_pool(ArchPool(
    "text",
    (PoolMember("text_bag", label="fasttext"), PoolMember("text_cnn", label="textcnn"),
     PoolMember("text_bigru", label="bigru"), PoolMember("text_transformer", label="transformer")),
    "CPU-sized heterogeneous text pool (token ids, 64-d embeddings), HtFLlib-style: bag of embeddings "
    "(fastText), TextCNN (widths 3-5), bidirectional GRU, 2-layer Transformer encoder.",
))
register_pool(ArchPool(
    "text-cnn", (PoolMember("text_cnn", label="textcnn"),),
    "Homogeneous text pool (every client a TextCNN), e.g. for fedavg on a text task.",
))
register_pool(ArchPool(
    "heterofl-cnn", (PoolMember("heterofl_cnn", label="heterofl-cnn"),),
    "One width-scalable global model, HeteroFL's CNN at CPU size (4 conv layers of 16-128 channels, scaler, "
    "static BN): the sub-model methods (heterofl, fedrolex, fjord) slice each client's width from it.",
))
register_pool(ArchPool(
    "heterofl-cnn-paper", (PoolMember("heterofl_cnn", {"hidden": (64, 128, 256, 512)}, "heterofl-cnn-paper"),),
    "HeteroFL's CNN at the paper's widths (64, 128, 256, 512 channels), for the sub-model methods.",
))
register_pool(ArchPool(
    "heterofl-resnet18", (PoolMember("heterofl_resnet18", label="heterofl-resnet18"),),
    "One width-scalable global model, HeteroFL's pre-activation ResNet-18 at CPU size (stages of 16-128 channels, "
    "scaler, static BN): for the width sub-model methods (heterofl, fedrolex, fjord: --pool heterofl-resnet18).",
))
register_pool(ArchPool(
    "heterofl-resnet18-paper",
    (PoolMember("heterofl_resnet18", {"hidden": (64, 128, 256, 512)}, "heterofl-resnet18-paper"),),
    "HeteroFL's pre-activation ResNet-18 at the paper's widths (stages of 64, 128, 256, 512 channels), for the "
    "width sub-model methods.",
))
register_pool(ArchPool(
    "depthfl-cnn", (PoolMember("depthfl_cnn", label="depthfl-cnn"),),
    "One depth-scalable global model, DepthFL's CNN at CPU size (4 conv-BN-ReLU blocks of 16-128 channels, an "
    "exit classifier after each): the depth sub-model method (depthfl) gives each client its first 1-4 blocks.",
))
register_pool(ArchPool(
    "heterofl-cnn-levels",
    tuple(PoolMember("heterofl_cnn", {"rate": rate}, f"heterofl-cnn-{level}") for level, rate in LEVELS.items()),
    "HeteroFL's CNN of pool heterofl-cnn built at each capacity level a-e (width 1 to 1/16) as five independent "
    "architectures, round-robin; with --capacity-profile each client gets the level the sub-model methods give it "
    "under that profile and seed (the two families on the same clients).",
    capacity_levels=True,
))
