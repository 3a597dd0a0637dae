from tests.conftest import new_id
from tests.helpers import book, make_slots


async def test_book_and_cancel(client):
    _, slots = await make_slots(client)
    assert len(slots) == 4
    patient = new_id()
    r = await book(client, slots[0]["id"], patient)
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "BOOKED"
