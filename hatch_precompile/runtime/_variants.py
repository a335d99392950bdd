"""Verify and load: a model's shape variants, each in the form `_choice.plan`
chose, as graphs that `_handle.py` binds weights to.

Each form's `load` checks its files against the manifest before it runs or
maps any of them (`_integrity.py`), then loads them for the caller's kind of
array. A variant whose form fails to load here (the dynamic loader refuses a
library) loads in the next form that fits, unless the policy is "error".
"""

from __future__ import annotations

from ._arrays import ArrayKind
from ._choice import FORM_VARIABLE, FORMS, Choice, next_form
from ._contract import CallContract
from ._errors import PrecompiledModelError
from ._graph import FormUnavailable, Graph
from ._ops import import_op_libraries
from ._schema import ModelEntry


class Variants:
    """The loaded shape variants of one model for one CPU target and one kind of
    array, most specialised first, each a graph that a handle binds weights to.
    The reason a variant loads in a later form than planned is in `failure`;
    where no other form fits, FormUnavailable says so and the fallback applies."""

    def __init__(self, name: str, model: ModelEntry, choices: list[Choice], policy: str, kind: ArrayKind) -> None:
        self.name, self.dims, self.kind = name, model["dims"], kind
        self.contract = CallContract(name, model["inputs"], model["dims"], kind)
        import_op_libraries(model["op_libraries"])
        ordered = sorted(choices, key=lambda c: len(c.artifact["specialized"]), reverse=True)
        self.failure = ""
        self.variants: list[tuple[dict[str, int], str, Graph]] = []
        for planned in ordered:
            graph, choice = self._load(name, model, planned, policy)
            self.variants.append((choice.artifact["specialized"], choice.file, graph))
        self.files = [file for _, file, _ in self.variants]

    def _load(self, name: str, model: ModelEntry, choice: Choice, policy: str) -> tuple[Graph, Choice]:
        try:
            return FORMS[choice.form].load(name, model, choice.artifact, self.kind), choice
        except FormUnavailable as error:
            other = next_form(model, choice)
            if other is None:  # the model's fallback applies (`load_compiled`)
                raise FormUnavailable(f"{error}, and no other form of {choice.artifact['file']} fits here") from None
            if policy == "error":
                raise PrecompiledModelError(f"model {name!r}: {error} (fallback is 'error'; {FORM_VARIABLE}={other.form} loads the {other.title} instead)") from None
            self.failure = str(error)
            return self._load(name, model, other, policy)

    def pick(self, sizes: dict[str, int]) -> int:
        """The index of the variant for these dim sizes: an exact bucket, else the dynamic one."""
        for index, (specialized, _, _) in enumerate(self.variants):
            if all(sizes.get(dim) == size for dim, size in specialized.items()):
                return index
        dim, size = next((d, sizes[d]) for d, spec in self.dims.items() if not spec["dynamic"] and sizes[d] not in spec["buckets"])
        raise ValueError(f"model {self.name!r}: dim {dim!r} is {size}, but it was compiled only for the sizes {self.dims[dim]['buckets']}")
