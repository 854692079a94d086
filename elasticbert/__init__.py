"""ElasticBERT: BERT with an exit at every layer, shared by pre-training, fine-tuning and early-exit inference.

`import elasticbert` registers the classes with `AutoConfig` / `AutoModel*`, so `AutoModel.from_pretrained(dir)`
works on our exports with no remote code.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForPreTraining,
    AutoModelForSequenceClassification,
)

from .configuration import ElasticBertConfig
from .early_exit import EarlyExitResult, make_rule, run_batch
from .exit_setting import EarlyExitSetting
from .fnlp_export import LayoutError, export_fnlp, save_fnlp
from .gradient_equilibrium import equilibrium_weights, rescale_gradient
from .hashee import (
    HASHEE_MODEL_TYPE,
    ElasticBertHashEEConfig,
    ElasticBertHashEEForSequenceClassification,
    ElasticBertHashEEModel,
)
from .loading import CheckpointError, LoadReport, load_pretrained, minilm_dir, save_early_exit
from .model_card import write_model_card
from .modeling import (
    ElasticBertForPreTraining,
    ElasticBertForSequenceClassification,
    ElasticBertModel,
    ElasticBertPreTrainedModel,
    exit_groups,
)
from .precision import for_inference

AutoConfig.register("elasticbert", ElasticBertConfig, exist_ok=True)
AutoModel.register(ElasticBertConfig, ElasticBertModel, exist_ok=True)
AutoModelForPreTraining.register(ElasticBertConfig, ElasticBertForPreTraining, exist_ok=True)
AutoModelForSequenceClassification.register(ElasticBertConfig, ElasticBertForSequenceClassification, exist_ok=True)
AutoConfig.register(HASHEE_MODEL_TYPE, ElasticBertHashEEConfig, exist_ok=True)  # HashEE: token-level exit
AutoModel.register(ElasticBertHashEEConfig, ElasticBertHashEEModel, exist_ok=True)
AutoModelForSequenceClassification.register(
    ElasticBertHashEEConfig, ElasticBertHashEEForSequenceClassification, exist_ok=True
)

__all__ = [
    "CheckpointError",
    "EarlyExitResult",
    "EarlyExitSetting",
    "ElasticBertConfig",
    "ElasticBertForPreTraining",
    "ElasticBertForSequenceClassification",
    "ElasticBertHashEEConfig",
    "ElasticBertHashEEForSequenceClassification",
    "ElasticBertHashEEModel",
    "ElasticBertModel",
    "ElasticBertPreTrainedModel",
    "LayoutError",
    "LoadReport",
    "equilibrium_weights",
    "exit_groups",
    "export_fnlp",
    "for_inference",
    "load_pretrained",
    "make_rule",
    "minilm_dir",
    "rescale_gradient",
    "run_batch",
    "save_fnlp",
    "save_early_exit",
    "write_model_card",
]
