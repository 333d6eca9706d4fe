"""The rule for job class names: what ``--iso-class`` accepts and what the config may declare.

One definition, shared by the config loader (a class users could not select is a config
error) and the submit-option validator (whose limits the SPANK plugin and job_submit.lua
are generated from). A leaf module: the hooks import it, so it imports nothing.
"""

from __future__ import annotations

CLASS_MAX_LEN = 32
CLASS_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CLASS_CHARS = CLASS_FIRST + "0123456789_-"


def class_name_problem(name: str) -> str:
    """Why ``name`` cannot be a class name, or "" if it can."""
    if not 1 <= len(name) <= CLASS_MAX_LEN:
        return f"must be 1 to {CLASS_MAX_LEN} characters"
    if name[0] not in CLASS_FIRST or any(ch not in CLASS_CHARS for ch in name):
        return "must be a letter followed by letters, digits, _ or -"
    return ""
