"""The numerics: what a correct port's rounding can do, and how far a port is from it.

``precision`` the floating-point formats (unit roundoffs, bits, ranges: defined once);
``error_model`` the forward error model (every stage's oracle value and unit bound);
``compare`` a port's stages against it; ``tolerances`` the calibrated tolerances and
``calibrate`` their measurement (``python -m conformance calibrate``); ``gradients`` the
backward error model, its comparison and calibration (``python -m conformance calibrate
--grad``); ``provenance`` what produced a measurement; ``mapped`` the pages of arrays mapped
from files, given back once read.
"""
