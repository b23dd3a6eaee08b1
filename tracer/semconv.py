"""Attribute names: the OpenTelemetry GenAI semantic conventions and tracejudge's own, in one place.

The consumer reads exactly what the tracer writes, so both import these constants.
"""

from __future__ import annotations

GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
ERROR_TYPE = "error.type"
OPERATION_INVOKE_AGENT = "invoke_agent"

TURN_INDEX = "tracejudge.turn.index"
CONVERSATION_ENDED = "tracejudge.conversation.ended"
FEEDBACK_SCORE = "tracejudge.feedback.score"
FEEDBACK_LABEL = "tracejudge.feedback.label"
FEEDBACK_COMMENT = "tracejudge.feedback.comment"

END_CONVERSATION_SPAN = "end_conversation"
FEEDBACK_SPAN = "feedback"
TRACER_NAME = "tracejudge.tracer"
