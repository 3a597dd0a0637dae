from tests.helpers.appointments import book, make_slots
from tests.helpers.auth import new_id


async def test_book_and_cancel(client):
    _, slots = await make_slots(client)
    assert len(slots) == 4
    patient = new_id()
    r = await book(client, slots[0]["id"], patient)
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "BOOKED"
