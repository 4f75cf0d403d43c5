"""The registry of interchangeable components, one table per axis.

Every component, built-in or not, enters through :func:`register`, keyed by its ``name``
attribute; a spec string (:class:`strategies.spec.Spec`) names one per axis. A new
component is one class in one file::

    @strategies.register("averaging")
    class Median(strategies.Averaging):
        name = "median"
        ...

    strategies.make("median/solve/full/normal:newton")

This module imports nothing of the package: the component files import it.
"""

from __future__ import annotations

#: The axes of a growth spec, then the baselines (strategies of their own, outside the grid).
AXES = ("averaging", "inverse", "truncation", "line_search", "baseline")

#: ``{axis: {name: class}}``, in registration order (the built-ins first, in their files' order).
REGISTRY: dict[str, dict[str, type]] = {axis: {} for axis in AXES}

# Characters a spec string uses as separators: a name holding one could not be parsed back.
_SEPARATORS = "/:+ "


def _check_name(axis: str, name: object, cls: type) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__qualname__}: a component needs a non-empty string `name` to be registered")
    if name != name.lower() or any(ch in name for ch in _SEPARATORS):
        raise ValueError(f"{axis} name {name!r}: use lower case, without any of {_SEPARATORS.strip()!r} or spaces")
    if axis == "baseline" and name in ("default",):
        raise ValueError(f"baseline name {name!r} is reserved for the default preset")
    return name


def register(axis: str, name: str | None = None):
    """Class decorator adding a component to an axis of the registry.

    Parameters
    ----------
    axis : {"averaging", "inverse", "truncation", "line_search", "baseline"}
        The axis the class is a component of.
    name : str, optional
        The key in spec strings; by default the class's ``name`` attribute. Given, it is
        also set as the class's ``name``.

    Returns
    -------
    callable
        The decorator; it returns the class unchanged otherwise.

    Raises
    ------
    ValueError
        An unknown axis, a name a spec string could not hold, or a name already taken by
        another class (re-registering the same class, as a module reload does, is allowed).
    """
    if axis not in REGISTRY:
        raise ValueError(f"unknown axis {axis!r}; valid: {', '.join(REGISTRY)}")

    def deco(cls: type) -> type:
        key = _check_name(axis, getattr(cls, "name", None) if name is None else name, cls)
        taken = REGISTRY[axis].get(key)
        if taken is not None and (taken.__module__, taken.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"{axis} {key!r} is already registered to {taken.__module__}.{taken.__qualname__}")
        cls.name = key
        REGISTRY[axis][key] = cls
        return cls

    return deco


def outside_modules() -> list[str]:
    """Modules, outside this package, that registered a component (for worker processes to import).

    Returns
    -------
    list of str
        Importable module names, sorted; ``__main__`` is left out (a worker cannot import
        a script's main module by that name).
    """
    mods = {cls.__module__ for table in REGISTRY.values() for cls in table.values()}
    return sorted(m for m in mods if m != __package__ and not m.startswith(f"{__package__}.") and m != "__main__")
