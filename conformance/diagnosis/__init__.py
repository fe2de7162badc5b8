"""Say what the bug is, not only where: named bug classes fitted at the divergent stage
(``classes``: the table; ``fit``: the fit and the verdict's line)."""

from conformance.diagnosis.fit import Diagnosis, diagnose, dropout, guarded

__all__ = ["Diagnosis", "diagnose", "dropout", "guarded"]
