"""Chain stages, named like the functions they run: ``stages.top_p(0.9)`` is a :class:`~jaxsample.samplers.top_p.TopP`.

Each stage lives next to its function (one sampler per module, :mod:`jaxsample.samplers`; the
processors in their own modules); this module only names them. A stage is a frozen dataclass:
its fields are static configuration (window sizes, token-id tables, candidate counts) and the
*defaults* of its per-row parameters. Stages compare by their static fields only, so
``stages.top_p(0.9) == stages.top_p(0.5)``: samplers that differ in values share one
compilation, and the values themselves travel in ``params`` (see :class:`jaxsample.Sampler`).
"""

from jaxsample.chain import MIN_KEEP
from jaxsample.constraints import AllowedTokens as allowed_tokens
from jaxsample.constraints import IgnoreEos as ignore_eos
from jaxsample.constraints import LogitBias as logit_bias
from jaxsample.constraints import SuppressTokens as suppress_tokens
from jaxsample.constraints import SuppressTokensAtBegin as suppress_tokens_at_begin
from jaxsample.dry import Dry as dry
from jaxsample.infill import Infill as infill
from jaxsample.lengths import ExponentialDecayLengthPenalty as exponential_decay_length_penalty
from jaxsample.lengths import ForcedBos as forced_bos
from jaxsample.lengths import ForcedEos as forced_eos
from jaxsample.lengths import MinTokens as min_tokens
from jaxsample.ngram import BadWords as bad_words
from jaxsample.ngram import EncoderNoRepeatNgram as encoder_no_repeat_ngram
from jaxsample.ngram import NoRepeatNgram as no_repeat_ngram
from jaxsample.ngram import SequenceBias as sequence_bias
from jaxsample.normalization import LogSoftmax as log_softmax
from jaxsample.normalization import RemoveInfNan as remove_inf_nan
from jaxsample.penalties import EncoderRepetitionPenalty as encoder_repetition_penalty
from jaxsample.penalties import Penalties as penalties
from jaxsample.reasoning import ReasoningBudget as reasoning_budget
from jaxsample.samplers.adaptive_p import AdaptiveP as adaptive_p
from jaxsample.samplers.categorical import Categorical as categorical
from jaxsample.samplers.epsilon_cutoff import EpsilonCutoff as epsilon_cutoff
from jaxsample.samplers.eta_cutoff import EtaCutoff as eta_cutoff
from jaxsample.samplers.greedy import Greedy as greedy
from jaxsample.samplers.min_p import MinP as min_p
from jaxsample.samplers.mirostat import Mirostat as mirostat
from jaxsample.samplers.mirostat import MirostatV2 as mirostat_v2
from jaxsample.samplers.p_less import PLess as p_less
from jaxsample.samplers.temperature import DynamicTemperature as dynamic_temperature
from jaxsample.samplers.temperature import Temperature as temperature
from jaxsample.samplers.top_h import TopH as top_h
from jaxsample.samplers.top_k import TopK as top_k
from jaxsample.samplers.top_n_sigma import TopNSigma as top_n_sigma
from jaxsample.samplers.top_p import TopP as top_p
from jaxsample.samplers.typical import Typical as typical
from jaxsample.samplers.xtc import XTC as xtc
from jaxsample.structured.stage import GrammarStage as grammar
from jaxsample.structured.triggers import LazyGrammarStage as lazy_grammar
from jaxsample.synthid import SynthIDWatermark as synthid_watermark
from jaxsample.watermark import Watermark as watermark

__all__ = [
    "MIN_KEEP",
    "adaptive_p",
    "allowed_tokens",
    "bad_words",
    "categorical",
    "dry",
    "dynamic_temperature",
    "encoder_no_repeat_ngram",
    "encoder_repetition_penalty",
    "epsilon_cutoff",
    "eta_cutoff",
    "exponential_decay_length_penalty",
    "forced_bos",
    "forced_eos",
    "grammar",
    "greedy",
    "ignore_eos",
    "infill",
    "lazy_grammar",
    "log_softmax",
    "logit_bias",
    "min_p",
    "min_tokens",
    "mirostat",
    "mirostat_v2",
    "no_repeat_ngram",
    "p_less",
    "penalties",
    "reasoning_budget",
    "remove_inf_nan",
    "sequence_bias",
    "suppress_tokens",
    "suppress_tokens_at_begin",
    "synthid_watermark",
    "temperature",
    "top_h",
    "top_k",
    "top_n_sigma",
    "top_p",
    "typical",
    "watermark",
    "xtc",
]
