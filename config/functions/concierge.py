"""Functions and code blocks of the LLM concierge agent (same bookings as the flow agent)."""

import bookings_db

_DEMO_KEY = "demo-key-set-booking_code_key"


@Action
def book_table(party_size: int, when: str, name: str, phone: str, seating: str = "indoor") -> dict:
    """Book a table.

    Args:
        party_size: How many people (1 to 12).
        when: Date and time in ISO format, YYYY-MM-DDTHH:MM.
        name: Name the booking is under.
        phone: Phone number, digits only.
        seating: indoor or terrace.
    """
    key = secrets.get("booking_code_key") or _DEMO_KEY
    try:
        code = bookings_db.book(key, party_size, when, name, phone, seating)
    except ValueError as exc:
        raise ToolError(str(exc)) from None
    state["booking_code"] = code
    state["phone"] = phone
    return {"code": code, "when": bookings_db.spoken_datetime(when)}


def find_booking(phone: str) -> dict:
    """Find the caller's current booking by phone number.

    Args:
        phone: Phone number, digits only.
    """
    booking = bookings_db.find_by_phone(phone)
    if booking is None:
        raise ToolError("no booking under that number")
    state["booking_code"] = booking["code"]
    return {**booking, "when": bookings_db.spoken_datetime(booking["at"])}


def cancel_booking(booking_code: str) -> dict:
    """Cancel a booking found with find_booking.

    Args:
        booking_code: The code find_booking returned.
    """
    bookings_db.cancel(booking_code)
    state["booking_code"] = None
    return {"cancelled": True}


@BeforeModelTrigger("$session.params.should_escalate = true AND $session.params.escalated != true")
def calm_down():
    state["escalated"] = True
    respond("I'm sorry this has been frustrating. Let me take you through it step by step.")


@BeforeModelTrigger(
    "$session.params.phone != null AND $session.params.booking_code = null"
    " AND $session.params.looked_up != true"
)
def look_up_caller():
    # The caller's number came with the call (e.g. Twilio's From): find their booking before
    # the model answers, so it can greet them with it. The LLM sees the result.
    state["looked_up"] = True
    add_override(find_booking, {"phone": state["phone"]})


@BeforeActionTrigger('$next-action.name = "cancel_booking" AND $session.params.booking_code = null')
def guard_cancel():
    respond("Let me find your booking first. What phone number is it under?")


@EventTrigger(event="no-input")
def still_there():
    respond("Are you still there?")


def classify_request() -> dict:
    """What the caller wants (book, change or cancel), by the offline intent matcher."""
    said = history.last_user_utterance or ""
    best = flows.booking.match_intent(said).best
    if best is None:
        return {"intent": None}
    return {"intent": best.intent, "confidence": round(best.confidence, 2), **best.parameters}
