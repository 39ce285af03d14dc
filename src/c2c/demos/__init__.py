"""Demo scenarios: their content (questions, documents, prompts) lives here, out of the library."""
