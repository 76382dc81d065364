from fluxnetes.cli.main import app

app()
