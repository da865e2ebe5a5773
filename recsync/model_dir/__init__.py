"""The trained model on disk (docs/serving.md): written at the end of every run as OUT/model/
(write.py), read back without unpickling (read.py), loaded as a torch module that scores
(trained.py), scored in bulk (predict.py) and exported for serving (export.py)."""

from recsync.model_dir.read import ModelDirError, ModelFiles, read_model_dir  # noqa: F401
from recsync.model_dir.write import TrainedRows, write_model_dir  # noqa: F401
