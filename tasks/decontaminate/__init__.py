"""Stage `decontaminate`: GPT-3 App. C 13-gram removal against the evaluation tasks."""
