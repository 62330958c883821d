"""The studies: each made a results file in benchmark/results/ (benchmark/README.md maps them); run each as
`python -m benchmark.studies.<name>`."""
