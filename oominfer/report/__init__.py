"""What oominfer prints: human tables, memory bars and verdicts, and the JSON shapes."""
