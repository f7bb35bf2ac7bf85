# The opt-in MLflow log (docs/metrics.md, "Trackers"): one MLflow run per rung, logged by this
# one job after aggregate, never by the rungs (many jobs writing one SQLite file on Lustre meet
# its locks). Off unless the site config names trackers.mlflow_uri. A store that fails is a
# warning in its log and in results/mlflow.json, never a failed workflow.
# TensorBoard needs no rule: each rung writes its own events (trackers.tensorboard -> --tensorboard).

if SETTINGS.trackers.mlflow_uri:

    localrules:
        mlflow,

    rule mlflow:
        input:
            "results/ladder.h5",
        output:
            "results/mlflow.json",
        log:
            "results/logs/mlflow.log",
        params:
            env=swf.env_exports(SETTINGS.site),
            scaleladder=SCALELADDER,
            uri=SETTINGS.trackers.mlflow_uri,
            experiment=SETTINGS.trackers.mlflow_experiment,
        conda:
            "../envs/scaleladder.yaml"
        shell:
            "{params.env}{params.scaleladder} mlflow --ladder {input:q} --uri {params.uri:q} "
            "--experiment {params.experiment:q} --stamp {output:q} > {log:q} 2>&1"
