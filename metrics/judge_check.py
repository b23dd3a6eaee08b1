"""What a command checks about its judge before it starts: the model string routable, one cheap call answered.

Public, for the consumer's commands (and anyone embedding the judges); LiteLLM is imported by these calls only.
"""

from ._errors import JudgeCallError
from ._llm import JUDGE_CHECK_PROMPT, check_judge_model, judge_model_problem
from ._results import ERROR_RATE_LIMITED

__all__ = ["ERROR_RATE_LIMITED", "JUDGE_CHECK_PROMPT", "JudgeCallError", "check_judge_model", "judge_model_problem"]
