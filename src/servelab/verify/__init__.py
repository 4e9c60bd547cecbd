"""Output verification: does a server give right answers? (`servelab verify-output`, docs/cli/verify.md)

Import from here: `verify_output`, `VerifyResult`, `Check`, `Reference`, `parse_reference`.
"""

from __future__ import annotations

from servelab.verify.result import Check, Severity, VerifyResult
from servelab.verify.service import PROBES, Reference, parse_reference, verify_output

__all__ = ["PROBES", "Check", "Reference", "Severity", "VerifyResult", "parse_reference", "verify_output"]
