"""Run in a process of its own with KERAS_BACKEND set (Keras takes its backend once, at import):
keras-hub's ViT and its eps-1e-3 twin verified on quick cases; one JSON line of what was found."""

import json
import sys
from dataclasses import replace

from conformance.examples import keras_hub_vit
from conformance.verify.forward import verify
from impls import get_config
from tests.capture_cases import quick_cases
from tests.data import keras_nested_port

config = get_config("vit_test_token").replace(num_classes=0)
report = verify(keras_hub_vit.port, config, port="keras-hub", cases=quick_cases(config))
bug = verify(keras_hub_vit.eps_1e3_port, config, port="keras-hub, eps 1e-3", cases=quick_cases(config)[:1])
# the same backbone nested in a wrapper keras.Model; and mapped by its weights' own paths, which skip the wrapper
nested = verify(keras_nested_port.port, config, port="keras-hub in a wrapper", cases=quick_cases(config)[:1])
own_paths = replace(keras_nested_port.port, convert=keras_hub_vit.convert)
unprefixed = verify(own_paths, config, port="keras-hub in a wrapper, its paths", cases=quick_cases(config)[:1])
json.dump(
    {
        "conformant": report.conformant,
        "checked": len([s for s in report.stages if s.ok]),
        "unseen": sorted(report.unseen),
        "failures": report.failures[:2],
        "bug_located": bug.located(),
        "nested": [nested.conformant, len([s for s in nested.stages if s.ok])],
        "unprefixed": [unprefixed.first_divergence, unprefixed.failures[0]["reason"][-300:]],
    },
    sys.stdout,
)
