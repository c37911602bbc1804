"""Validators shared by every public boundary: a bad value is a ValueError naming it."""

import operator


def check_int(name: str, value, minimum: int | None = None, maximum: int | None = None) -> int:
    """Returns `value` as an int, or raises ValueError naming `name` and the value.

    Booleans are refused even though they are ints: ``max_draft_len=True`` is a mistake.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int, got {value!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_bool(name: str, value) -> bool:
    """Returns `value` if it is a bool (not merely truthy), else raises ValueError naming it."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


def check_float(name: str, value, minimum: float, maximum: float | None = None, *,
                open_minimum: bool = False) -> float:
    """Returns `value` as a float within its bounds (the minimum excluded with `open_minimum`),
    or raises ValueError naming `name` and the value."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    low = value > minimum if open_minimum else value >= minimum
    if not (low and (maximum is None or value <= maximum)):      # also refuses NaN
        bound = f"> {minimum}" if open_minimum else f">= {minimum}"
        bound += "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check_gate_fields(window, threshold) -> tuple[int | None, float | None]:
    """The acceptance gate's (window, threshold), validated and normalised (None stays None)."""
    if window is not None:
        window = check_int("acceptance_rate_window_size", window, minimum=0)
    if threshold is not None:
        if isinstance(threshold, bool):
            raise ValueError(f"acceptance_rate_threshold must be a number, got {threshold!r}")
        try:
            threshold = float(threshold)
        except (TypeError, ValueError):
            raise ValueError(
                f"acceptance_rate_threshold must be a number, got {threshold!r}") from None
        if not 0.0 <= threshold <= 1.0:  # also refuses NaN
            raise ValueError(f"acceptance_rate_threshold must be in [0, 1], got {threshold}")
    return window, threshold


GATES = ("permanent", "reversible")


def check_gate(gate) -> str:
    """The acceptance gate's kind, "permanent" or "reversible"; ValueError otherwise."""
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    return gate


def gate_is_active(window: int | None, threshold: float | None) -> bool:
    """Whether an acceptance gate with these settings can ever decide: a non-zero window and a
    threshold."""
    return bool(window) and threshold is not None
