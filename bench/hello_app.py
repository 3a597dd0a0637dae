"""The framework floor: a bare FastAPI hello, served by the same server stack as
`reservo api` (uvicorn, uvloop, httptools, same worker count). Every runner
measures it in the same invocation and prints its figures as a ratio of it, so a
figure taken on a busy shared machine still says how close it is to the floor."""

from fastapi import FastAPI

app = FastAPI()


@app.get("/hello")
async def hello() -> dict[str, str]:
    return {"hello": "world"}
