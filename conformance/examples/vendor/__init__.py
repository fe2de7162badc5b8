"""Third-party model code kept byte for byte as published, so the examples verify it unmodified
without installing packages whose pins clash with this project's.

mlxim_vit.py: mlx-image 0.1.10's ``mlxim/model/vit/vit.py`` (MIT, LICENSE.mlx-image). The
wheel's RECORD gives its sha256; conformance/tests/test_examples.py checks the copy against it.
(mlx-image itself pins mlx==0.24.2 and numpy==1.26.2.)
"""

MLX_IMAGE_VIT_SHA256 = "OL5p6ATl6yA3MdD4l8VIvXhwXQg5AvL1lkmwoNjNOiE"  # mlx_image-0.1.10.dist-info/RECORD
