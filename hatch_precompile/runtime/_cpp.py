"""The C++ form: the graph as AOTInductor's model container, compiled at build time.

The build compiled each variant's captured graph a second time with AOTInductor
into one library (`cpu_avx2_cpp.so`): the graph's wrapper in C++ and its kernels,
holding no weights. Loading it is one `dlopen` (no compiler, neither
`torch._inductor` nor `torch._dynamo` imported), and a call crosses into C++
once, where the lean form's Python wrapper makes one call per kernel and
allocation. The weights are bound by name, without a copy, to the tensors the
loader mapped from the weights file; a model with state gets one container per
handle, bound to that handle's own state, which its calls update in place.

It serves both kinds of array: torch tensors through torch's own runner
(`_torch_private.load_container`), NumPy arrays through the library's C
interface (`_container.py`) and the shim provider (`_shim.py`), with torch never
imported. What the NumPy path cannot serve, `numpy_refusal` says.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _shim, _torch_private
from ._arrays import ArrayKind, missing_numpy_dtype, numpy_dtype
from ._container import ContainerLibrary
from ._errors import PrecompiledIntegrityError
from ._graph import FormUnavailable
from ._integrity import verified_path
from ._manifest import HERE, same_torch_release, version_numbers
from ._schema import ArtifactEntry, CppRecord, InputLeaf, ModelEntry, TorchAndPython, has_cpp_form, is_torch_free

NAME, TITLE = "cpp", "C++ form"


shipped = has_cpp_form  # the build reads the manifest by the same rule


def refused(artifact: ArtifactEntry) -> str:
    return artifact.get("cpp", {}).get("refused", "")


def file(artifact: ArtifactEntry) -> str:
    return artifact["cpp"]["file"]


def problems(artifact: ArtifactEntry, here: TorchAndPython) -> list[str]:
    """A library linked against the libtorch of the release it was built with (any
    build of it: +cpu, CUDA), or a torch-free one, which needs no torch at all;
    neither has a Python symbol, and the wheel's tag still promises the build's
    Python or a later one."""
    built = artifact["built_with"]
    found = [] if is_torch_free(artifact) else same_torch_release(built, here)
    if version_numbers(here["python"]) < version_numbers(built["python"]):
        found.append(f"python differs: the wheel is for CPython {built['python']} or later")
    return found


def serves(model: ModelEntry, artifact: ArtifactEntry, arrays: str) -> str:
    """Why this variant's C++ form cannot take and return `arrays` ("torch" or
    "numpy") here; "" where it can."""
    if arrays == "torch":
        return 'it is torch-free: it runs on NumPy arrays (arrays="numpy"), on the wheel\'s own shim' if is_torch_free(artifact) else ""
    return numpy_refusal(model, artifact) or missing_numpy_dtype(model)


def numpy_refusal(model: ModelEntry, artifact: ArtifactEntry) -> str:
    """Why the NumPy path can never run this variant, from the manifest alone
    (`hatch-precompile inspect` says it too); "" where it can."""
    if not has_cpp_form(artifact):
        return f"the build refused it: {refused(artifact)}" if refused(artifact) else "none was built (cpp-form = false)"
    if "ops" in artifact["cpp"]:
        return "its C++ form calls ops through AOTInductor's proxy executor, which only torch's runner provides"
    if model["weights"]["mode"] == "factory":
        return 'its weights come from its factory (weights = "factory"), which only torch can run'
    return ""


def load(name: str, model: ModelEntry, artifact: ArtifactEntry, kind: ArrayKind) -> ContainerGraph | ArrayContainerGraph:
    """Verify the library, load it once (so that a library that cannot load here
    fails now, not at a handle's first call); returns the graph to bind."""
    record = artifact["cpp"]
    own = own_shim(artifact)
    if kind.NAME == "numpy":
        try:
            _shim.load(own)
        except _shim.ShimUnavailable as error:
            raise FormUnavailable(str(error)) from None
    path = verified_path(record)
    if "ops" in record:  # the runner reads it from beside the library
        verified_path(record["ops"])
    try:
        if kind.NAME == "numpy":
            return ArrayContainerGraph(path, record, model, own)
        return ContainerGraph(path, record, model["weights"]["order"], model["inputs"]["leaves"])
    except PrecompiledIntegrityError:
        raise
    except (RuntimeError, OSError) as error:
        raise FormUnavailable(f"{HERE / record['file']} cannot be loaded here: {error}") from None


def own_shim(artifact: ArtifactEntry) -> Path | None:
    """The wheel's own shim, verified against the manifest, for a torch-free
    variant; None for one that runs on torch's."""
    return _verified_own_shim() if is_torch_free(artifact) else None


@functools.cache
def _verified_own_shim() -> Path:
    """The shim and its OpenMP runtime, checked once: a process loads them once (`_shim.load`)."""
    from ._manifest import read_manifest

    manifest = read_manifest()
    if manifest is None or "shim" not in manifest or "openmp" not in manifest:
        raise PrecompiledIntegrityError(f"{HERE}'s manifest has a torch-free C++ form but names no shim for it: the install is damaged")
    verified_path(manifest["openmp"])
    return verified_path(manifest["shim"])


class ContainerGraph:
    """One variant's library, its first container loaded (RuntimeError where the
    dynamic loader refuses it); `bind` gives a function of the call's flat inputs."""

    def __init__(self, path: Path, record: CppRecord, order: list[str], leaves: list[InputLeaf]) -> None:
        self.path = path
        self._constants = {constant: order.index(weight) for constant, weight in record["constants"].items()}
        # The container takes the call's tensors alone: the constants a call passes are compiled in.
        self._tensors = [index for index, leaf in enumerate(leaves) if "dtype" in leaf]
        self._every_input_a_tensor = len(self._tensors) == len(leaves)
        self._returned = record.get("returned_inputs", [])  # [output, input]: an input returned as it is
        self._first: Any = _torch_private.load_container(path)  # loaded now, so that a library that cannot load fails here
        unbound = sorted(set(_torch_private.container_constant_names(self._first)) - set(self._constants))
        if unbound:  # AOTInductor's own refusal would not name them
            raise PrecompiledIntegrityError(f"{path}: the manifest binds none of its constants {', '.join(unbound)}: the library and the manifest are not of one build")
        self._taking = threading.Lock()  # two handles made at once must not share the first container

    def bind(self, weights: list[Any]) -> Callable[[list[Any]], Any]:
        """A container reading its constants from `weights` (the graph's order):
        the first bind takes the container `load` made, later ones a new one."""
        with self._taking:
            container, self._first = self._first, None
        if container is None:
            container = _torch_private.load_container(self.path)
        # Compiled for dense weights and nothing checks a constant's strides: a caller's
        # transposed or sliced tensor is bound as a dense copy (the shipped ones and the state are dense).
        bound = {constant: weights[index].contiguous() for constant, index in self._constants.items()}
        try:
            _torch_private.bind_constants(container, bound)
        except RuntimeError as error:
            raise PrecompiledIntegrityError(f"{self.path}: binding its weights failed: {error}") from None
        run: Callable[[list[Any]], Any] = container.run
        positions, returned = self._tensors, self._returned
        if not returned:
            return run if self._every_input_a_tensor else lambda inputs: run([inputs[index] for index in positions])

        def run_handing_back(inputs: list[Any]) -> Any:  # the container returns new tensors over these inputs' storage
            outputs = run([inputs[index] for index in positions])
            for output, given in returned:
                outputs[output] = inputs[given]
            return outputs

        return run_handing_back


class ArrayContainerGraph:
    """One variant's library on NumPy arrays: loaded through its C interface with
    the shim provider's tensors, its first container made now (OSError where the
    dynamic loader refuses the library); `bind` gives a function of the call's
    flat input arrays, which returns its output arrays."""

    def __init__(self, path: Path, record: CppRecord, model: ModelEntry, own_shim: Path | None = None) -> None:
        shim = _shim.load(own_shim)
        self.path, self._library = path, ContainerLibrary(path, shim)
        order, specs = model["weights"]["order"], model["weights"]["specs"]
        self._constants = {constant: (order.index(weight), shim.dtype_code(specs[weight]["dtype"])) for constant, weight in record["constants"].items()}
        leaves = model["inputs"]["leaves"]
        self._tensors = [index for index, leaf in enumerate(leaves) if "dtype" in leaf]
        self._codes = [shim.dtype_code(leaves[index]["dtype"]) for index in self._tensors]
        self._outputs = [(shim.array, numpy_dtype(leaf["dtype"])) for leaf in model["outputs"]["leaves"]]
        self._handed_back = {output: given for output, given in record.get("returned_inputs", [])}  # output -> the input it views
        self._first: Any = self._library.create()
        unbound = sorted(set(self._first.constant_names()) - set(self._constants))
        if unbound:
            raise PrecompiledIntegrityError(f"{path}: the manifest binds none of its constants {', '.join(unbound)}: the library and the manifest are not of one build")
        self._taking = threading.Lock()

    def bind(self, weights: list[Any]) -> Callable[[list[Any]], Any]:
        """A container reading its constants from `weights` (arrays, the graph's order)."""
        import numpy

        with self._taking:
            container, self._first = self._first, None
        if container is None:
            container = self._library.create()
        # Dense and aligned, as compiled: a caller's strided array is bound as a copy.
        container.bind({constant: (numpy.require(weights[index], requirements=("C", "A")), code) for constant, (index, code) in self._constants.items()})
        run, positions, outputs, handed_back = container.runner(self._codes), self._tensors, self._outputs, self._handed_back
        delete = self._library.shim.delete

        def run_on(inputs: list[Any]) -> list[Any]:
            made = []
            for output, ((array, dtype), handle) in enumerate(zip(outputs, run([inputs[index] for index in positions]))):
                if output in handed_back:  # the container returned a view of this input: the caller's own is handed back
                    delete(_shim.Handle(handle))
                    made.append(inputs[handed_back[output]])
                else:
                    made.append(array(handle, dtype))
            return made

        return run_on
