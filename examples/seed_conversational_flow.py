"""The seed document's usage snippet, unchanged but for the import line (and a print to show the result)."""

from tracejudge.metrics import (
    ConversationalFlowRateMetric,
    ConversationalEvalTestCase,
    EvalTestCase,
    evaluate_conversations,
)
import asyncio

metric = ConversationalFlowRateMetric(model="gpt-4o", threshold=0.7)

conversation = ConversationalEvalTestCase(
    turns=[
        EvalTestCase(
            input="Мне нужно сбросить пароль",
            actual_output="Помогу. Подтвердите, пожалуйста, email, привязанный к аккаунту.",
        ),
        EvalTestCase(
            input="user@example.com",
            actual_output="Ссылка для сброса пароля отправлена на user@example.com. Проверьте почту.",
        ),
    ]
)

results = asyncio.run(evaluate_conversations([conversation], [metric]))

# Added: show the result.
for conversation_result in results:
    for result in conversation_result.metrics:
        print(f"{result.name}: verdict={result.verdict} score={result.score} error={result.error}")
