"""`fluxnetes simulate`: replay an SWF trace through the queue and the matcher.

command.py holds the options, their help and the order of the steps; options.py checks the
options and builds the run plan (trace, machine, workload, runs, engines); run.py runs it;
results.py measures the runs and writes the CSV and plots; output.py prints the notes, the
tables or the JSON.
"""
