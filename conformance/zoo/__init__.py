"""The bug zoo: mutant ports, each a small readable variation of a correct port carrying a
real porting bug from the seed posts or a public report, with the stage where it first
diverges. They are checked exactly as a user's port is: through the port protocol.

    from conformance.zoo import MUTANTS
    MUTANTS["mlx_shared_layernorm"].factory  # "conformance.zoo.mlx_mutants:shared_layernorm"
"""

from conformance.zoo.catalogue import MUTANTS, Mutant

__all__ = ["MUTANTS", "Mutant"]
