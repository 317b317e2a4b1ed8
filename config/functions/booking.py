"""Functions of the default table-booking agent.

`state`, `secrets`, `respond`, `EventTrigger` and `ToolError` come from the runtime: no import.
"""

import bookings_db

# The demo works without any secret; set one to make confirmation codes unguessable:
#   voice-agent secrets set booking_code_key
_DEMO_KEY = "demo-key-set-booking_code_key"


def quote_booking() -> dict:
    """Read the collected booking back to the caller before it is made."""
    spoken = bookings_db.spoken_datetime(state["when"])
    state["when_spoken"] = spoken
    return {"spoken": spoken}


def book_table(party_size: int, when: str, name: str, phone: str, seating: str = "indoor") -> dict:
    """Book a table and return its confirmation code.

    Args:
        party_size: How many people.
        when: Date and time, ISO format (YYYY-MM-DDTHH:MM).
        name: Name the booking is under.
        phone: The caller's phone number, digits only.
        seating: indoor or terrace.
    """
    key = secrets.get("booking_code_key") or _DEMO_KEY
    try:
        code = bookings_db.book(key, party_size, when, name, phone, seating)
    except ValueError as exc:
        raise ToolError(str(exc)) from None
    state["booking_code"] = code
    return {
        "code": code,
        "spaced_code": " ".join(code),
        "spoken": bookings_db.spoken_datetime(when),
    }


def find_booking(phone: str) -> dict:
    """Find the caller's booking by phone number."""
    booking = bookings_db.find_by_phone(phone)
    if booking is None:
        digits = " ".join(phone)
        raise ToolError(f"I couldn't find a booking under {digits}.")
    state["booking_code"] = booking["code"]
    state["booking_at"] = booking["at"]
    state["party_size"] = booking["party_size"]
    # From here on, a date or time the caller says is a change to this booking.
    state["date"] = None
    state["time"] = None
    return {**booking, "spoken": bookings_db.spoken_datetime(booking["at"])}


def change_booking(
    booking_code: str, booking_at: str, party_size: int, date: str = "", time: str = ""
) -> dict:
    """Move the booking to a new day and/or time, and/or change the party size.

    A caller who says only "eight pm" keeps the booking's day; only "friday" keeps its time.
    """
    old_date, old_time = booking_at.split("T")
    at = f"{date or old_date}T{time or old_time}"
    bookings_db.update(booking_code, party_size=party_size, at=at)
    state["booking_at"] = at
    state["when"] = at
    return {"spoken": bookings_db.spoken_datetime(at), "party_size": party_size}


def cancel_booking(booking_code: str) -> dict:
    """Cancel the booking."""
    bookings_db.cancel(booking_code)
    state["booking_code"] = None
    return {"cancelled": booking_code}


def update_phone(new_phone: str) -> None:
    """Remember a new phone number for the caller."""
    state["phone"] = new_phone


def what_is_my_name() -> str:
    """The caller's name, as far as we know it."""
    return state.get("name") or "I don't know your name yet"


@EventTrigger(event="dtmf")
def on_keypad(digit: str):
    if digit == "0":
        respond("We're open every day from noon to eleven pm.")
