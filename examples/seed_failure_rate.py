"""The seed document's usage snippet, unchanged but for the import line (and a print to show the result)."""

from tracejudge.metrics import (
    FailureRateMetric,
    ConversationalEvalTestCase,
    EvalTestCase,
    evaluate_conversations,
)
import asyncio

metric = FailureRateMetric(model="gpt-4o", threshold=0.7)

conversation = ConversationalEvalTestCase(
    turns=[
        EvalTestCase(
            input="Какое население Атлантиды в 2024 году?",
            actual_output="Атлантида — мифический город, реальных данных о населении нет. Если вы имели в виду реальный город, уточните, пожалуйста.",
        ),
        EvalTestCase(
            input="Хорошо, а какая точная глубина Марианской впадины сегодня?",
            actual_output="Измерения варьируются, но по последним сонарным данным — около 10 935 метров. Для точного актуального значения лучше свериться с датасетом NOAA.",
        ),
    ]
)

results = asyncio.run(evaluate_conversations([conversation], [metric]))
# обе реплики классифицируются как honest_fallback или alternative_proposed → оценка = 1.0

# Added: show the result.
for conversation_result in results:
    for result in conversation_result.metrics:
        print(f"{result.name}: verdict={result.verdict} score={result.score} error={result.error}")
